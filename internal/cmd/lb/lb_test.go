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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/loopback"
)

// namedBackend answers each connection with its name.
func namedBackend(t *testing.T, name string) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_, _ = io.WriteString(c, name)
			_ = c.Close()
		}
	}()
	return ln.Addr().String(), &n
}

func freePort(t *testing.T) string {
	t.Helper()
	at, err := loopback.FreeAddr("tcp")
	if err != nil {
		t.Fatal(err)
	}
	return at.String()
}

func ask(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	b, err := io.ReadAll(c)
	return string(b), err
}

func config(frontend string, backends ...string) string {
	host, port, _ := net.SplitHostPort(frontend)
	var b strings.Builder
	fmt.Fprintf(&b, "frontends:\n- name: web\n  address: %s\n  port: %s\n  backends:\n", host, port)
	for _, be := range backends {
		parts := strings.Fields(be)
		h, p, _ := net.SplitHostPort(parts[0])
		fmt.Fprintf(&b, "  - {address: %s, port: %s", h, p)
		if len(parts) > 1 {
			fmt.Fprintf(&b, ", adminState: %s", parts[1])
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// eventually waits up to 5 s for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stillRunning fails if the Run behind done has returned: what must still
// be serving a connection.
func stillRunning(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s returned (%v) with a connection still open", what, err)
	default:
	}
}

// returnsCleanly waits up to 5 s for the Run behind done to return, and
// fails on its error.
func returnsCleanly(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s did not return once its last connection ended (or its timeout ran out)", what)
	}
}

// replaceFile writes s to a temporary file beside path and renames it over
// path, so a reader sees the old contents or the new, never a part.
func replaceFile(t *testing.T, path, s string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// The standalone load balancer serves its file, follows changes to it and
// SIGHUP, keeps the running configuration when the file turns invalid, and
// serves metrics.
func TestStandaloneFollowsConfigFile(t *testing.T) {
	a, _ := namedBackend(t, "a")
	b, _ := namedBackend(t, "b")
	fe := freePort(t)
	metrics := freePort(t)
	file := filepath.Join(t.TempDir(), "lb.yaml")
	write := func(s string) { t.Helper(); replaceFile(t, file, s) }
	write(config(fe, a))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := &Options{ConfigFile: file, MetricsAddress: metrics, PollInterval: 20 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()

	eventually(t, "serving a", func() bool { got, _ := ask(fe); return got == "a" })

	write(config(fe, a+" Down", b))
	eventually(t, "the file change to reach the data plane", func() bool { got, _ := ask(fe); return got == "b" })
	for range 10 {
		if got, err := ask(fe); got != "b" {
			t.Fatalf("with a Down: answer %q, err %v", got, err)
		}
	}

	write("frontends: [{name: web, address: nonsense}]")
	eventually(t, "the invalid file to be read and refused", func() bool {
		return strings.Contains(scrape(t, metrics), `ebb_lb_config_reloads_total{result="error"} 1`)
	})
	if got, err := ask(fe); got != "b" {
		t.Fatalf("an invalid file changed the running configuration: %q, %v", got, err)
	}

	write(config(fe, a))
	eventually(t, "a fixed file to apply", func() bool { got, _ := ask(fe); return got == "a" })

	body := scrape(t, metrics)
	for _, want := range []string{`ebb_lb_config_reloads_total{result="error"} 1`, `ebb_dataplane_connections_total{backend="` + a, "ebb_dataplane_apply_duration_seconds_count"} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// SIGHUP reloads the file at once, without waiting for the next poll.
func TestStandaloneReloadsOnSIGHUP(t *testing.T) {
	a, _ := namedBackend(t, "a")
	b, _ := namedBackend(t, "b")
	fe := freePort(t)
	file := filepath.Join(t.TempDir(), "lb.yaml")
	if err := os.WriteFile(file, []byte(config(fe, a)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := &Options{ConfigFile: file, PollInterval: time.Hour}
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	eventually(t, "serving a", func() bool { got, _ := ask(fe); return got == "a" })
	if err := os.WriteFile(file, []byte(config(fe, b)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, "SIGHUP to reload the file", func() bool { got, _ := ask(fe); return got == "b" })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestStandaloneRejectsBadFirstConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "lb.yaml")
	if err := os.WriteFile(file, []byte("frontends: [{name: web, address: 10.0.0.1, port: 80, protocol: SCTP}]"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := (&Options{ConfigFile: file, PollInterval: time.Second}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), `protocol "SCTP" is not supported: use TCP or UDP`) {
		t.Fatalf("error %v", err)
	}
}

// A file rewritten in place is empty for a moment; the running
// configuration stays until the new contents arrive, and an empty file is
// reported as an error.
func TestStandaloneKeepsServingThroughAnEmptyFile(t *testing.T) {
	a, _ := namedBackend(t, "a")
	b, _ := namedBackend(t, "b")
	fe := freePort(t)
	metrics := freePort(t)
	file := filepath.Join(t.TempDir(), "lb.yaml")
	replaceFile(t, file, config(fe, a))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := &Options{ConfigFile: file, MetricsAddress: metrics, PollInterval: 10 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	eventually(t, "serving a", func() bool { got, _ := ask(fe); return got == "a" })

	replaceFile(t, file, "\n")
	eventually(t, "the empty file reported as an error", func() bool {
		return strings.Contains(scrape(t, metrics), `ebb_lb_config_reloads_total{result="error"} 1`)
	})
	if got, err := ask(fe); got != "a" {
		t.Fatalf("an empty file changed the running configuration: %q, %v", got, err)
	}

	replaceFile(t, file, config(fe, b))
	eventually(t, "the file written after the empty one to apply", func() bool { got, _ := ask(fe); return got == "b" })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// A class that no Service could carry is refused before anything starts,
// with what a valid one looks like.
func TestClusterModeRefusesAnInvalidClass(t *testing.T) {
	err := (&Options{LoadBalancerClass: "ebb.dev/L4 fast"}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), `--load-balancer-class: load balancer class "ebb.dev/L4 fast" is not a label-style key such as ebb.dev/l4`) {
		t.Fatalf("error %v", err)
	}
}

// echoBackend echoes on every connection until the test ends.
func echoBackend(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// establish waits until a connection to fe echoes, as what is awaited,
// and returns it open.
func establish(t *testing.T, fe, what string) net.Conn {
	t.Helper()
	var long net.Conn
	eventually(t, what, func() bool {
		c, err := net.DialTimeout("tcp", fe, time.Second)
		if err == nil && echoRoundTrip(c, "hello") == nil {
			long = c
			return true
		}
		if c != nil {
			c.Close()
		}
		return false
	})
	return long
}

// echoRoundTrip writes msg on c and reads the echo back.
func echoRoundTrip(c net.Conn, msg string) error {
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return err
}

// A graceful stop (SIGTERM cancels Run's context): new connections are
// refused at once, an established one is served until it ends, and then
// the process leaves; one still open at the shutdown timeout is closed.
func TestStopServesEstablishedConnectionsUntilTheyEnd(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
	}{{"connection ends first", 30 * time.Second}, {"timeout first", 300 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			fe := freePort(t)
			file := filepath.Join(t.TempDir(), "lb.yaml")
			replaceFile(t, file, config(fe, echoBackend(t)))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			o := &Options{ConfigFile: file, PollInterval: time.Hour, ShutdownTimeout: tc.timeout}
			done := make(chan error, 1)
			go func() { done <- o.Run(ctx) }()
			long := establish(t, fe, "serving")
			defer long.Close()

			stopped := time.Now()
			cancel()
			eventually(t, "new connections to be refused", func() bool {
				c, err := net.DialTimeout("tcp", fe, time.Second)
				if err == nil {
					c.Close()
				}
				return err != nil
			})
			if tc.timeout > time.Second {
				if err := echoRoundTrip(long, "still served"); err != nil {
					t.Fatalf("the established connection broke during the stop: %v", err)
				}
				stillRunning(t, done, "Run")
				long.Close()
			}
			returnsCleanly(t, done, "Run")
			if tc.timeout < time.Second {
				if took := time.Since(stopped); took < tc.timeout {
					t.Errorf("Run returned %s after the stop, before the shutdown timeout %s", took, tc.timeout)
				}
				if err := echoRoundTrip(long, "after the timeout"); err == nil {
					t.Error("the connection left at the shutdown timeout still works")
				}
			}
		})
	}
}
