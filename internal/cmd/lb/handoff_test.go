package lb

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"

	"github.com/ebbdev/ebb/internal/handoff"
)

func scrapeOrEmpty(addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func readyz(addr string) bool {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// A new ebb lb on the host takes over from the running one: under a steady
// stream of new connections none fails, the old process's established
// connection is served until it ends, and then the old process exits by
// itself. Both are told the same metrics address, as two pods of one host
// network are: the new one serves it once the old one lets go.
func TestSuccessorTakesOverWithoutDroppingAConnection(t *testing.T) {
	fe := freePort(t)
	file := filepath.Join(t.TempDir(), "lb.yaml")
	replaceFile(t, file, config(fe, echoBackend(t)))
	socket := fmt.Sprintf("@ebb-lb-test-%d", os.Getpid())
	run := func(ctx context.Context, metrics string) <-chan error {
		o := &Options{ConfigFile: file, PollInterval: time.Hour, ShutdownTimeout: 30 * time.Second,
			MetricsAddress: metrics, HandoffSocket: socket, ExitAfterHandoff: true}
		done := make(chan error, 1)
		go func() { done <- o.Run(ctx) }()
		return done
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	metrics := freePort(t)
	oldDone := run(ctx, metrics)
	long := establish(t, fe, "the first process serving")
	defer long.Close()

	// New connections, one after another, through the whole hand-off.
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stopLoad := make(chan struct{})
	var load sync.WaitGroup
	load.Add(1)
	go func() {
		defer load.Done()
		for {
			select {
			case <-stopLoad:
				return
			default:
			}
			c, err := net.DialTimeout("tcp", fe, time.Second)
			if err == nil {
				err = echoRoundTrip(c, "ping")
				c.Close()
			}
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
				continue
			}
			ok.Add(1)
		}
	}()

	newDone := run(ctx, metrics)
	eventually(t, "the successor serving the metrics address, ready", func() bool {
		return readyz(metrics) && strings.Contains(scrapeOrEmpty(metrics), `ebb_lb_handoffs_total{result="success",role="successor"} 1`)
	})
	if err := echoRoundTrip(long, "still served"); err != nil {
		t.Fatalf("the predecessor's established connection broke: %v", err)
	}
	stillRunning(t, oldDone, "the predecessor")
	long.Close()
	returnsCleanly(t, oldDone, "the predecessor")
	before := ok.Load()
	eventually(t, "connections after the predecessor left", func() bool { return ok.Load() > before+10 })
	close(stopLoad)
	load.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d connections failed during the hand-off; first: %v", n, n+ok.Load(), firstErr.Load())
	}
	t.Logf("%d connections, none failed", ok.Load())
	cancel()
	if err := <-newDone; err != nil {
		t.Fatal(err)
	}
}

// Told to stop while a successor is taking over (a DaemonSet may stop the
// old pod as soon as the new one looks ready), the running process lets
// the hand-off finish: the successor is released, not left without the
// host, and the sockets it took keep accepting after the old one is gone.
func TestStopWhileASuccessorTakesOverFinishesTheHandOff(t *testing.T) {
	fe := freePort(t)
	file := filepath.Join(t.TempDir(), "lb.yaml")
	replaceFile(t, file, config(fe, echoBackend(t)))
	socket := fmt.Sprintf("@ebb-lb-test-stop-%d", os.Getpid())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := &Options{ConfigFile: file, PollInterval: time.Hour, ShutdownTimeout: 5 * time.Second, HandoffSocket: socket, ExitAfterHandoff: true}
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	eventually(t, "serving", func() bool {
		c, err := net.DialTimeout("tcp", fe, time.Second)
		if err == nil {
			defer c.Close()
			return echoRoundTrip(c, "hello") == nil
		}
		return false
	})

	var taken *handoff.Taken
	eventually(t, "the sockets offered", func() bool {
		var err error
		taken, err = handoff.Take(context.Background(), socket)
		if err != nil {
			t.Fatal(err)
		}
		return taken != nil
	})
	if len(taken.Files) != 1 {
		t.Fatalf("took %d sockets", len(taken.Files))
	}
	ln, err := net.FileListener(taken.Files[0])
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	cancel() // SIGTERM, mid-hand-off
	time.Sleep(200 * time.Millisecond)
	if err := taken.Serving(context.Background()); err != nil {
		t.Fatalf("the stopping process did not finish the hand-off: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the old process did not exit")
	}
	c, err := net.DialTimeout("tcp", fe, time.Second)
	if err != nil {
		t.Fatalf("the handed-over socket refuses connections once the old process is gone: %v", err)
	}
	c.Close()
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(2 * time.Second))
	if a, err := ln.Accept(); err != nil {
		t.Fatalf("the successor's socket did not get the connection: %v", err)
	} else {
		a.Close()
	}
}

// A process told to stop before any successor came (a DaemonSet may stop
// the old pod first) drains without a hand-off; a new process that starts
// beside it meanwhile serves on sockets of its own, and the old one lets go
// of the shared metrics and readiness address as soon as it finds it, so
// the new pod's readiness is its own rather than the draining process's
// "not ready" for as long as the old connections last.
func TestAStoppingProcessLeavesTheHostToANewOneBesideIt(t *testing.T) {
	fe := freePort(t)
	file := filepath.Join(t.TempDir(), "lb.yaml")
	replaceFile(t, file, config(fe, echoBackend(t)))
	socket := fmt.Sprintf("@ebb-lb-test-beside-%d", os.Getpid())
	metrics := freePort(t)
	run := func(ctx context.Context) <-chan error {
		o := &Options{ConfigFile: file, PollInterval: 100 * time.Millisecond, ShutdownTimeout: 30 * time.Second,
			MetricsAddress: metrics, HandoffSocket: socket, ExitAfterHandoff: true}
		done := make(chan error, 1)
		go func() { done <- o.Run(logr.NewContext(ctx, testr.New(t))) }()
		return done
	}
	oldCtx, stopOld := context.WithCancel(context.Background())
	defer stopOld()
	oldDone := run(oldCtx)
	long := establish(t, fe, "the first process serving")
	defer long.Close()
	eventually(t, "the first process ready", func() bool { return readyz(metrics) })

	stopOld() // SIGTERM with no successor: a graceful stop, its connection kept
	eventually(t, "the stopping process not ready", func() bool { return !readyz(metrics) })
	newCtx, stopNew := context.WithCancel(context.Background())
	defer stopNew()
	newDone := run(newCtx)
	eventually(t, "the new process serving the address and ready, while the old one drains", func() bool {
		c, err := net.DialTimeout("tcp", fe, time.Second)
		if err != nil {
			return false
		}
		defer c.Close()
		return echoRoundTrip(c, "new") == nil && readyz(metrics)
	})
	if err := echoRoundTrip(long, "still served"); err != nil {
		t.Fatalf("the stopping process's established connection broke: %v", err)
	}
	stillRunning(t, oldDone, "the stopping process")
	long.Close()
	returnsCleanly(t, oldDone, "the stopping process")
	if !readyz(metrics) {
		t.Fatal("the new process is not ready once the old one left")
	}
	stopNew()
	if err := <-newDone; err != nil {
		t.Fatal(err)
	}
}
