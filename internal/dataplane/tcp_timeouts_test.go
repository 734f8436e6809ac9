package dataplane

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	testingclock "k8s.io/utils/clock/testing"
)

// A connection quiet in both directions for the idle timeout ends; one
// with traffic in the same time does not. The sweeper runs on the injected
// clock.
func TestIdleConnectionsEnd(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		a := newTestBackend(t)
		clk := testingclock.NewFakeClock(time.Now())
		d := newDataPlane(t, Options{Clock: clk, GoroutineProxy: proxy.GoroutineProxy})
		at := freeAddr(t, "tcp")
		fe := tcpFrontend("web", at, a.backend())
		fe.IdleTimeout.Duration = 10 * time.Second
		mustApply(t, d, fe)
		quiet, busy := dialed(t, at.String()), dialed(t, at.String())
		waitFor(t, "both connections in the table", func() bool { return len(d.conns.snapshot(nil)) == 2 })
		for range 14 {
			if err := roundTrip(busy, []byte("x")); err != nil {
				t.Fatalf("a busy connection broke: %v", err)
			}
			before := d.conns.sweeps.Load()
			clk.Step(idleSweepInterval)
			waitFor(t, "a sweep", func() bool { return d.conns.sweeps.Load() > before })
		}
		waitFor(t, "the quiet connection to end", func() bool { return closedByPeer(quiet) })
		if err := roundTrip(busy, []byte("still there")); err != nil {
			t.Errorf("the busy connection ended with the quiet one: %v", err)
		}
	})
}

// dialed connects to addr and closes the connection when the test ends.
func dialed(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// closedByPeer reports whether the far end has closed c.
func closedByPeer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// A backend that does not answer a connect is given up after the connect
// timeout, and the connection moves on to the next backend.
func TestConnectTimeoutMovesOn(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		good := newTestBackend(t)
		silent := blackhole(t)
		d := newDataPlane(t, proxy)
		at := freeAddr(t, "tcp")
		fe := tcpFrontend("web", at, Backend{Address: silent.Addr().String(), Port: silent.Port()}, good.backend())
		fe.ConnectTimeout.Duration = 300 * time.Millisecond
		mustApply(t, d, fe)
		var slowest time.Duration
		for i := range 4 {
			start := time.Now()
			c, err := net.DialTimeout("tcp", at.String(), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			// The client's connect is accepted at once; the round trip waits
			// for the data plane's dial.
			_ = c.SetDeadline(time.Now().Add(3 * time.Second))
			err = roundTrip(c, []byte("hello"))
			_ = c.Close()
			if err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
			slowest = max(slowest, time.Since(start))
		}
		if slowest < 300*time.Millisecond || slowest > 2*time.Second {
			t.Errorf("the slowest connection took %s; want the connect timeout (300ms) and then the next backend", slowest)
		}
		if good.accepted.Load() != 4 {
			t.Errorf("the answering backend took %d of 4 connections", good.accepted.Load())
		}
	})
}

// blackhole returns a loopback address that never answers a connect: a
// listener with a full accept queue, whose kernel drops new SYNs.
func blackhole(t *testing.T) netip.AddrPort {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	at := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(sa.(*unix.SockaddrInet4).Port))
	// Backlog 0 queues one connection; fill it.
	for {
		c, err := net.DialTimeout("tcp", at.String(), 200*time.Millisecond)
		if err != nil {
			return at
		}
		t.Cleanup(func() { _ = c.Close() })
	}
}

// TCP keep-alive is off unless the frontend asks for it, then on both
// sides.
func TestTCPKeepAliveOnlyWhenConfigured(t *testing.T) {
	for _, tc := range []struct {
		keepAlive  time.Duration
		goroutines bool
	}{{0, false}, {30 * time.Second, false}, {0, true}, {30 * time.Second, true}} {
		keepAlive := tc.keepAlive
		t.Run(fmt.Sprintf("%s goroutines=%v", keepAlive, tc.goroutines), func(t *testing.T) {
			a := newTestBackend(t)
			d := newDataPlane(t, Options{GoroutineProxy: tc.goroutines})
			at := freeAddr(t, "tcp")
			fe := tcpFrontend("web", at, a.backend())
			fe.TCPKeepAlive.Duration = keepAlive
			mustApply(t, d, fe)
			c := dialed(t, at.String())
			if err := roundTrip(c, []byte("x")); err != nil {
				t.Fatal(err)
			}
			conns := d.conns.snapshot(nil)
			if len(conns) != 1 {
				t.Fatalf("%d connections in the table, want 1", len(conns))
			}
			want := 0
			if keepAlive > 0 {
				want = 1
			}
			for side, got := range connSockoptInt(t, d, conns[0], unix.SOL_SOCKET, unix.SO_KEEPALIVE) {
				if got != want {
					t.Errorf("%s side: SO_KEEPALIVE %d, want %d", side, got, want)
				}
			}
			if keepAlive > 0 {
				// The same probes on both paths: after 30 s, every 6 s, 5 of them.
				for _, o := range []struct {
					name      string
					opt, want int
				}{{"TCP_KEEPIDLE", unix.TCP_KEEPIDLE, 30}, {"TCP_KEEPINTVL", unix.TCP_KEEPINTVL, 6}, {"TCP_KEEPCNT", unix.TCP_KEEPCNT, 5}} {
					for side, got := range connSockoptInt(t, d, conns[0], unix.SOL_TCP, o.opt) {
						if got != o.want {
							t.Errorf("%s side: %s %d, want %d", side, o.name, got, o.want)
						}
					}
				}
			}
			// Every proxied socket forwards each write at once.
			for side, got := range connSockoptInt(t, d, conns[0], unix.SOL_TCP, unix.TCP_NODELAY) {
				if got != 1 {
					t.Errorf("%s side: TCP_NODELAY %d, want 1", side, got)
				}
			}
		})
	}
}

// connSockoptInt reads a socket option of both sides of a proxied
// connection, by side ("client", "backend").
func connSockoptInt(t *testing.T, d *DataPlane, c *tcpConn, level, opt int) map[string]int {
	t.Helper()
	out := map[string]int{}
	switch e := c.ends.(type) {
	case netConns:
		out["client"] = sockoptInt(t, e.client, level, opt)
		out["backend"] = sockoptInt(t, e.upstream, level, opt)
	case *loopConn:
		var errs []error
		d.loop.call(func() {
			for side, fd := range map[string]int{"client": e.client.fd, "backend": e.upstream.fd} {
				v, err := unix.GetsockoptInt(fd, level, opt)
				out[side] = v
				errs = append(errs, err)
			}
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func sockoptInt(t *testing.T, c net.Conn, level, opt int) int {
	t.Helper()
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var serr error
	if err := raw.Control(func(fd uintptr) { v, serr = unix.GetsockoptInt(int(fd), level, opt) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return v
}

// The sweeper leaves alone what moved or is in bulk mode, and ends what
// has been quiet for its idle timeout.
func TestSweep(t *testing.T) {
	t0 := time.Now()
	for _, tc := range []struct {
		name       string
		moved      bool
		bulk       bool
		quietFor   time.Duration
		wantClosed bool
	}{
		{name: "quiet for the timeout", quietFor: 10 * time.Second, wantClosed: true},
		{name: "quiet for less", quietFor: 9 * time.Second},
		{name: "moved since the last sweep", moved: true, quietFor: time.Hour},
		{name: "in bulk mode", bulk: true, quietFor: time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, upstream := net.Pipe()
			defer client.Close()
			c := &tcpConn{ends: netConns{client, upstream}, idleTimeout: 10 * time.Second, quietSince: t0}
			if tc.moved {
				c.activity.Add(1)
			}
			if tc.bulk {
				c.bulk.Add(1)
			}
			table := newConnTable()
			table.add(c)
			if closed := table.sweep(t0.Add(tc.quietFor)); (closed == 1) != tc.wantClosed {
				t.Errorf("closed %d, want closed=%v", closed, tc.wantClosed)
			}
			if !tc.wantClosed && !c.quietSince.Equal(t0) != (tc.moved || tc.bulk) {
				t.Errorf("quiet since %s: the quiet period should restart only after traffic or bulk mode", c.quietSince.Sub(t0))
			}
		})
	}
}
