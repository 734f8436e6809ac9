package dataplane

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Many connections at once, each sending in both directions at once and
// more than a socket buffer holds, come back byte-exact: the event loop's
// partial writes, back-pressure and half-closes, beside the goroutines'.
func TestManyConcurrentStreamsStayByteExact(t *testing.T) {
	for _, goroutines := range []bool{false, true} {
		t.Run(fmt.Sprintf("goroutines=%v", goroutines), func(t *testing.T) {
			a, b := newTestBackend(t), newTestBackend(t)
			d := newDataPlane(t, Options{GoroutineProxy: goroutines})
			at := freeAddr(t, "tcp")
			mustApply(t, d, tcpFrontend("web", at, a.backend(), b.backend()))
			sizes := []int{1, 100, 64 << 10, (64 << 10) + 1, 3 << 20}
			var wg sync.WaitGroup
			errs := make(chan error, 200)
			for i := range 100 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- echoStream(at.String(), sizes[i%len(sizes)])
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			waitFor(t, "every connection to close", func() bool { return d.Connections() == 0 })
		})
	}
}

// echoStream writes n random bytes while reading the echo, half-closes,
// and checks that exactly those bytes came back before the end of the
// stream.
func echoStream(addr string, n int) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	msg := make([]byte, n)
	_, _ = rand.Read(msg)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(msg)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(c)
	if err := errors.Join(err, <-werr); err != nil {
		return fmt.Errorf("%d bytes: %w", n, err)
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("%d bytes sent, %d came back (equal: false)", n, len(got))
	}
	return nil
}

// On the event loop, a client whose every backend refuses is reset after
// each backend was tried once per round for refusedHold, and each refusal
// is counted.
func TestLoopRefusedEverywhereResetsTheClient(t *testing.T) {
	reg := prometheus.NewRegistry()
	d := newDataPlane(t, Options{Registerer: reg})
	var backends []Backend
	for range 2 {
		dead := freeAddr(t, "tcp") // nothing listens here: refused
		backends = append(backends, Backend{Address: dead.Addr().String(), Port: dead.Port()})
	}
	at := freeAddr(t, "tcp")
	mustApply(t, d, tcpFrontend("web", at, backends...))
	// The reset may come before the dial returns, or on the first read.
	start := time.Now()
	c, err := net.Dial("tcp", at.String())
	if err == nil {
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
	}
	if !isReset(err) {
		t.Fatalf("%v, want a reset", err)
	}
	if took := time.Since(start); took < refusedHold {
		t.Errorf("reset after %v, want it after the hold (%v)", took, refusedHold)
	}
	if got, want := sumCounters(t, reg, "ebb_dataplane_dial_errors_total"), float64(2*dialRounds); got != want {
		t.Errorf("%v dial errors, want %v (two backends, %d rounds)", got, want, dialRounds)
	}
	if got := testutil.ToFloat64(d.m.refused.WithLabelValues("web", "no_backend")); got != 1 {
		t.Errorf("%v refused for no backend, want 1", got)
	}
}

// A backend that starts listening while a connection waits between its
// dial rounds (a node port whose kube-proxy caught up) takes the connection
// in the second round: the client sees a short delay, not a reset.
func TestABackendListeningAfterTheFirstRoundTakesTheConnection(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		reg := prometheus.NewRegistry()
		proxy.Registerer = reg
		d := newDataPlane(t, proxy)
		late, dead := freeAddr(t, "tcp"), freeAddr(t, "tcp") // both refuse at first
		at := freeAddr(t, "tcp")
		mustApply(t, d, tcpFrontend("web", at,
			Backend{Address: late.Addr().String(), Port: late.Port()},
			Backend{Address: dead.Addr().String(), Port: dead.Port()}))
		done := make(chan error, 1)
		go func() { done <- dialRoundTrip(at.String()) }()
		for sumCounters(t, reg, "ebb_dataplane_dial_errors_total") < 2 {
			time.Sleep(time.Millisecond)
		}
		ln, err := net.Listen("tcp", late.String())
		if err != nil {
			t.Fatal(err)
		}
		serveEcho(t, ln)
		if err := <-done; err != nil {
			t.Fatalf("round trip: %v, want it to reach the backend that started listening", err)
		}
		if got := sumCounters(t, reg, "ebb_dataplane_dial_errors_total"); got != 2 {
			t.Errorf("%v dial errors, want 2 (the first round)", got)
		}
	})
}

// heldConnection is one client connection that ebb holds between dial
// rounds because its only backend refuses, and a backend that answers,
// started once the connection is held, for the test to apply.
type heldConnection struct {
	d         *DataPlane
	at        netip.AddrPort
	answering Backend
	// done gets the round trip's result.
	done chan error
}

// holdConnection applies a frontend "web" whose only backend refuses,
// starts a round trip through it, and returns once a dial was refused.
func holdConnection(t *testing.T, proxy Options) heldConnection {
	t.Helper()
	reg := prometheus.NewRegistry()
	proxy.Registerer = reg
	h := heldConnection{d: newDataPlane(t, proxy), at: freeAddr(t, "tcp"), done: make(chan error, 1)}
	gone := freeAddr(t, "tcp") // refuses for the whole test
	mustApply(t, h.d, tcpFrontend("web", h.at, Backend{Address: gone.Addr().String(), Port: gone.Port()}))
	go func() { h.done <- dialRoundTrip(h.at.String()) }()
	for sumCounters(t, reg, "ebb_dataplane_dial_errors_total") < 1 {
		time.Sleep(time.Millisecond)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveEcho(t, ln)
	answering := netip.MustParseAddrPort(ln.Addr().String())
	h.answering = Backend{Address: answering.Addr().String(), Port: answering.Port()}
	return h
}

// A connection held while every backend refuses (a new Service whose
// node ports kube-proxy has not programmed, a single pod being replaced)
// takes, in its next round, a backend that an endpoint change added
// during the hold, instead of retrying only the backends it was accepted
// with until the client is reset.
func TestAHeldConnectionTakesABackendAddedDuringTheHold(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		start := time.Now()
		h := holdConnection(t, proxy)
		mustApply(t, h.d, tcpFrontend("web", h.at, h.answering))
		if err := <-h.done; err != nil {
			t.Fatalf("round trip: %v, want it to reach the backend added during the hold", err)
		}
		if took := time.Since(start); took >= refusedHold {
			t.Errorf("answered after %v, want it within the hold (%v): the next round after the change", took, refusedHold)
		}
		if got := h.d.held.Load(); got != 0 {
			t.Errorf("%d places among the held connections still taken, want 0", got)
		}
	})
}

// A connection held while its backends refuse is refused, not proxied,
// when the backends of its next round no longer admit its client (the
// Service's source ranges were narrowed during the hold).
func TestAHeldConnectionIsRefusedWhenTheSourceRangesNoLongerAdmitIt(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		h := holdConnection(t, proxy)
		fe := tcpFrontend("web", h.at, h.answering)
		fe.SourceRanges = []string{"192.0.2.0/24"}
		mustApply(t, h.d, fe)
		if err := <-h.done; err == nil {
			t.Fatal("the held client was proxied after the source ranges stopped admitting it")
		}
		if got := testutil.ToFloat64(h.d.m.refused.WithLabelValues("web", "source_range")); got != 1 {
			t.Errorf("%v refused for the source ranges, want 1", got)
		}
	})
}

// Past maxHeld connections held between rounds, a client whose backends
// all refuse is reset at once, as before the hold, and counted: a flood of
// connections to a Service whose node ports refuse holds no more.
func TestHeldConnectionsAreBounded(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		reg := prometheus.NewRegistry()
		proxy.Registerer = reg
		d := newDataPlane(t, proxy)
		dead := freeAddr(t, "tcp")
		at := freeAddr(t, "tcp")
		mustApply(t, d, tcpFrontend("web", at, Backend{Address: dead.Addr().String(), Port: dead.Port()}))
		d.held.Store(maxHeld) // every place taken
		start := time.Now()
		err := dialRoundTrip(at.String())
		if !isReset(err) && !errors.Is(err, io.EOF) {
			t.Fatalf("%v, want a reset", err)
		}
		if took := time.Since(start); took >= dialRoundPause {
			t.Errorf("reset after %v, want it at once (no place to hold it)", took)
		}
		if got := testutil.ToFloat64(d.m.refused.WithLabelValues("web", "hold_limit")); got != 1 {
			t.Errorf("%v refused for the hold limit, want 1", got)
		}
		if got := d.held.Load(); got != maxHeld {
			t.Errorf("%d places taken after the refusal, want %d (none taken or leaked)", got, maxHeld)
		}
		waitFor(t, "the refused connection to leave the count", func() bool { return d.Connections() == 0 })
	})
}

// A graceful stop waits for a connection that is still looking for a
// backend as it waits for an established one: Connections counts it, and
// once the listeners are closed it still gets its backend. (Until
// 2026-11-29 it counted only established connections, so a stop that
// found none closed the data plane under a held connection, and its
// client got a FIN instead of its answer.)
func TestAGracefulStopWaitsForAHeldConnection(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		h := holdConnection(t, proxy)
		h.d.StopAccepting()
		if got := h.d.Connections(); got != 1 {
			t.Errorf("Connections() = %d while a connection is held, want 1 (a stop would not wait for it)", got)
		}
		mustApply(t, h.d, tcpFrontend("web", h.at, h.answering))
		if err := <-h.done; err != nil {
			t.Fatalf("the held connection after the listeners closed: %v, want its answer", err)
		}
		waitFor(t, "the connection to end", func() bool { return h.d.Connections() == 0 })
	})
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

// sumCounters adds up every series of a counter.
func sumCounters(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// A request and the client's FIN that arrive together (the loop reads the
// request short of its buffer with the FIN already signalled, and takes
// that as the end without another read) still reach the backend whole,
// and the answer still reaches the client.
func TestLoopRequestAndFINTogether(t *testing.T) {
	a := newTestBackend(t)
	d := newDataPlane(t, Options{})
	at := freeAddr(t, "tcp")
	mustApply(t, d, tcpFrontend("web", at, a.backend()))
	for i := range 50 {
		c, err := net.Dial("tcp", at.String())
		if err != nil {
			t.Fatal(err)
		}
		msg := []byte(fmt.Sprintf("request %d", i))
		// One write and the FIN right after it: usually one event.
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		_ = c.(*net.TCPConn).CloseWrite()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, err := io.ReadAll(c)
		_ = c.Close()
		if err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("connection %d: got %q (%v), want %q", i, got, err, msg)
		}
	}
}
