package dataplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	testingclock "k8s.io/utils/clock/testing"
)

// Admin Down mid-stream: the established connection stays byte-exact, and
// no new connection reaches the backend; Down to None restores it.
func TestAdminDownKeepsEstablishedConnectionsAndStopsNewOnes(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		a, b := newTestBackend(t), newTestBackend(t)
		d := newDataPlane(t, proxy)
		at := freeAddr(t, "tcp")
		fe := tcpFrontend("web", at, a.backend(), b.backend())
		mustApply(t, d, fe)

		// Find a connection that went to a.
		var conn net.Conn
		for conn == nil {
			before := a.accepted.Load()
			c, err := net.Dial("tcp", at.String())
			if err != nil {
				t.Fatal(err)
			}
			if err := roundTrip(c, []byte("x")); err != nil {
				t.Fatal(err)
			}
			if a.accepted.Load() > before {
				conn = c
				defer c.Close()
			} else {
				c.Close()
			}
		}

		fe.Backends[0].AdminState = AdminDown
		mustApply(t, d, fe)
		acceptedAtDown := a.accepted.Load()

		// The established connection carries 1 MiB both ways, byte-exact.
		payload := make([]byte, 1<<20)
		_, _ = rand.Read(payload)
		go func() { _, _ = conn.Write(payload) }()
		got := make([]byte, len(payload))
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(conn, got); err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("established connection after admin Down: err %v, equal %v", err, bytes.Equal(got, payload))
		}
		for i := range 20 {
			if err := dialRoundTrip(at.String()); err != nil {
				t.Fatalf("new connection %d with one backend Down: %v", i, err)
			}
		}
		if n := a.accepted.Load() - acceptedAtDown; n != 0 {
			t.Errorf("%d new connections reached the admin Down backend", n)
		}

		fe.Backends[0].AdminState = AdminNone
		mustApply(t, d, fe)
		for range 20 {
			if err := dialRoundTrip(at.String()); err != nil {
				t.Fatal(err)
			}
		}
		if a.accepted.Load() == acceptedAtDown {
			t.Error("no new connection reached the backend after admin None")
		}
	})
}

// With every backend ineligible, a new connection is refused at once, not
// left hanging.
func TestAllBackendsDownRefusesFast(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		a := newTestBackend(t)
		d := newDataPlane(t, proxy)
		at := freeAddr(t, "tcp")
		be := a.backend()
		be.AdminState = AdminDown
		mustApply(t, d, tcpFrontend("web", at, be))
		// The reset may already fail the dial, or else the first read. A
		// client left hanging instead would hit the read deadline: a timeout,
		// which fails the test without a wall-clock bound that a loaded
		// machine could break.
		c, err := net.Dial("tcp", at.String())
		if err == nil {
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = c.Read(make([]byte, 1))
		}
		if err == nil || errors.Is(err, errTimeout(err)) {
			t.Fatalf("connecting to a frontend without eligible backends: %v; want a reset", err)
		}
		if a.accepted.Load() != 0 {
			t.Error("the admin Down backend got a connection")
		}
	})
}

// errTimeout returns err if it is a timeout, so a timeout fails the check
// above while a reset passes.
func errTimeout(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return err
	}
	return errors.New("not a timeout")
}

// Half-close: the client's end of stream reaches the backend, whose answer
// still reaches the client.
func TestHalfClose(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		a := newTestBackend(t)
		d := newDataPlane(t, proxy)
		at := freeAddr(t, "tcp")
		mustApply(t, d, tcpFrontend("web", at, a.backend()))
		c, err := net.Dial("tcp", at.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		msg := bytes.Repeat([]byte("half-close "), 10000)
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("reading after half-close: %v", err)
		}
		if !bytes.Equal(got, msg) {
			t.Errorf("got %d bytes back, want %d", len(got), len(msg))
		}
	})
}

// A dial failure moves a new connection on to the next eligible backend;
// backends that refuse at once do not use up the attempts, so one
// answering backend among many refusing ones serves every connection (a
// new Service whose node port only one node has programmed yet).
func TestDialFailureTriesNextBackend(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		a := newTestBackend(t)
		backends := []Backend{a.backend()}
		for range 5 {
			dead := freeAddr(t, "tcp") // nothing listens here: refused
			backends = append(backends, Backend{Address: dead.Addr().String(), Port: dead.Port()})
		}
		d := newDataPlane(t, proxy)
		at := freeAddr(t, "tcp")
		mustApply(t, d, tcpFrontend("web", at, backends...))
		for i := range 20 {
			if err := dialRoundTrip(at.String()); err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
		}
	})
}

// Backends that refuse are tried again, round after round, before the
// client is reset: a node port refuses until its kube-proxy programmed it,
// or when it picked a pod that has just stopped listening, and the next
// dial picks again. A client is reset once every eligible backend refused
// in every round of the hold (refusedHold), without trying more.
func TestRefusingBackendsAreTriedAgainDuringTheHold(t *testing.T) {
	for _, tc := range []struct {
		name    string
		refuse  int // the first dials refused
		served  bool
		dialled int64 // dials made for the one connection
	}{
		{"first round refused", 2, true, 3},
		{"three of four refused", 3, true, 4},
		{"every dial refused", 100, false, int64(2 * dialRounds)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newTestBackend(t), newTestBackend(t)
			var dials atomic.Int64
			var d net.Dialer
			refusing := func(ctx context.Context, network, addr string) (net.Conn, error) {
				if dials.Add(1) <= int64(tc.refuse) {
					return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
				}
				return d.DialContext(ctx, network, addr)
			}
			dp := newDataPlane(t, Options{DialContext: refusing, GoroutineProxy: true})
			at := freeAddr(t, "tcp")
			mustApply(t, dp, tcpFrontend("web", at, a.backend(), b.backend()))
			err := dialRoundTrip(at.String())
			if served := err == nil; served != tc.served {
				t.Errorf("served: %v (%v), want %v", served, err, tc.served)
			}
			if got := dials.Load(); got != tc.dialled {
				t.Errorf("%d dials, want %d", got, tc.dialled)
			}
		})
	}
}

// Source ranges admit only the listed client prefixes.
func TestSourceRanges(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		a := newTestBackend(t)
		d := newDataPlane(t, proxy)
		at := freeAddr(t, "tcp")
		fe := tcpFrontend("web", at, a.backend())
		fe.SourceRanges = []string{"192.0.2.0/24"}
		mustApply(t, d, fe)
		if err := dialRoundTrip(at.String()); err == nil {
			t.Fatal("a client outside the source ranges was served")
		}
		fe.SourceRanges = []string{"192.0.2.0/24", "127.0.0.0/8"}
		mustApply(t, d, fe)
		if err := dialRoundTrip(at.String()); err != nil {
			t.Fatalf("a client inside the source ranges: %v", err)
		}
	})
}

// PROXY protocol v2 tells the backend the client's address.
func TestProxyProtocolV2(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		headers := make(chan []byte, 1)
		a := newTestBackend(t, func(c net.Conn) {
			hdr := make([]byte, 28)
			_, _ = io.ReadFull(c, hdr)
			headers <- hdr
		})
		d := newDataPlane(t, proxy)
		at := freeAddr(t, "tcp")
		fe := tcpFrontend("web", at, a.backend())
		fe.ProxyProtocol = true
		mustApply(t, d, fe)
		c, err := net.Dial("tcp", at.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := roundTrip(c, []byte("after the header")); err != nil {
			t.Fatal(err)
		}
		want := proxyHeaderV2(c.LocalAddr().(*net.TCPAddr).AddrPort(), at)
		if got := <-headers; !bytes.Equal(got, want) {
			t.Errorf("header %x, want %x", got, want)
		}
		if !bytes.HasPrefix(want, proxyV2Signature) || want[12] != 0x21 || want[13] != 0x11 {
			t.Errorf("not a PROXY v2 TCP4 header: %x", want)
		}
	})
}

// Least connections sends a new connection to the backend with fewer.
func TestLeastConnections(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		a, b := newTestBackend(t), newTestBackend(t)
		d := newDataPlane(t, proxy)
		at := freeAddr(t, "tcp")
		fe := tcpFrontend("web", at, a.backend(), b.backend())
		fe.Balancing = LeastConnections
		mustApply(t, d, fe)
		var open []net.Conn
		defer func() {
			for _, c := range open {
				c.Close()
			}
		}()
		for range 4 {
			c, err := net.Dial("tcp", at.String())
			if err != nil {
				t.Fatal(err)
			}
			open = append(open, c)
			if err := roundTrip(c, []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		if a.accepted.Load() != 2 || b.accepted.Load() != 2 {
			t.Errorf("4 long connections split %d/%d, want 2/2", a.accepted.Load(), b.accepted.Load())
		}
	})
}

// Removing a backend drains it: established connections continue, or end
// after the drain timeout.
func TestRemovedBackendDrains(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		for _, drain := range []time.Duration{0, 200 * time.Millisecond} {
			t.Run(fmt.Sprintf("drainTimeout=%s", drain), func(t *testing.T) {
				a, b := newTestBackend(t), newTestBackend(t)
				clk := testingclock.NewFakeClock(time.Now())
				d := newDataPlane(t, Options{Clock: clk, GoroutineProxy: proxy.GoroutineProxy})
				at := freeAddr(t, "tcp")
				fe := tcpFrontend("web", at, a.backend())
				fe.DrainTimeout.Duration = drain
				mustApply(t, d, fe)
				c, err := net.Dial("tcp", at.String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if err := roundTrip(c, []byte("x")); err != nil {
					t.Fatal(err)
				}
				fe.Backends = []Backend{b.backend()}
				mustApply(t, d, fe)
				if err := roundTrip(c, []byte("still there")); err != nil {
					t.Fatalf("right after removal: %v", err)
				}
				// The drain timer runs on the injected clock: step past it.
				clk.Step(400 * time.Millisecond)
				if drain == 0 {
					if err := roundTrip(c, []byte("later")); err != nil {
						t.Errorf("without a drain timeout the connection broke: %v", err)
					}
				} else {
					waitFor(t, "the connection to end at the drain timeout", func() bool { return roundTrip(c, []byte("later")) != nil })
				}
				if err := dialRoundTrip(at.String()); err != nil || a.accepted.Load() != 1 {
					t.Errorf("new connection after removal: %v; removed backend accepted %d", err, a.accepted.Load())
				}
			})
		}
	})
}

// Reconfiguration under load drops nothing: clients keep connecting while
// backends are added, set Down, removed and frontends come and go; a
// long-lived connection on another frontend is not disturbed.
func TestReconfigurationUnderLoadDropsNothing(t *testing.T) {
	backends := []*testBackend{newTestBackend(t), newTestBackend(t), newTestBackend(t)}
	d := newDataPlane(t, Options{})
	at, other := freeAddr(t, "tcp"), freeAddr(t, "tcp")
	steady := tcpFrontend("steady", other, backends[0].backend())
	mustApply(t, d, tcpFrontend("web", at, backends[0].backend(), backends[1].backend()), steady)
	long, err := net.Dial("tcp", other.String())
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()

	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := dialRoundTrip(at.String()); err != nil {
					failed.Add(1)
					t.Errorf("request failed during reconfiguration: %v", err)
				} else {
					ok.Add(1)
				}
			}
		}()
	}
	configs := [][]Backend{
		{backends[0].backend(), backends[1].backend(), backends[2].backend()},
		{withAdmin(backends[0].backend(), AdminDown), backends[1].backend(), backends[2].backend()},
		{backends[1].backend(), backends[2].backend()},
		{backends[2].backend(), withAdmin(backends[1].backend(), AdminDown)},
		{backends[0].backend(), backends[1].backend()},
	}
	for i := range 50 {
		fs := []Frontend{tcpFrontend("web", at, configs[i%len(configs)]...), steady}
		if i%2 == 0 {
			fs = append(fs, tcpFrontend("extra", freeAddr(t, "tcp"), backends[2].backend()))
		}
		if err := applyAll(d, Config{Frontends: fs}); err != nil {
			t.Fatal(err)
		}
		if err := roundTrip(long, []byte(fmt.Sprintf("apply %d", i))); err != nil {
			t.Fatalf("long-lived connection on an unchanged frontend broke at apply %d: %v", i, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	t.Logf("%d requests through 50 reconfigurations, %d failed", ok.Load(), failed.Load())
	if ok.Load() < 100 {
		t.Errorf("only %d requests went through", ok.Load())
	}
}

func withAdmin(b Backend, s AdminState) Backend {
	b.AdminState = s
	return b
}

// A frontend that is invalid, conflicts with another or cannot listen is
// skipped and reported; every other frontend applies, and the running
// frontend of a conflict keeps its socket.
func TestApplySkipsOnlyTheFrontendsItCannotServe(t *testing.T) {
	a := newTestBackend(t)
	d := newDataPlane(t, Options{})
	at := freeAddr(t, "tcp")
	good := tcpFrontend("web", at, a.backend())
	mustApply(t, d, good)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := taken.Addr().(*net.TCPAddr).AddrPort()
	added := freeAddr(t, "tcp")
	invalid := tcpFrontend("invalid", freeAddr(t, "tcp"), a.backend())
	invalid.Address = "not-an-ip"
	res, err := d.Apply(Config{Frontends: []Frontend{
		tcpFrontend("usurper", at, a.backend()), // listed first, but web serves at already
		good,
		tcpFrontend("busy", busy, a.backend()),
		invalid,
		tcpFrontend("added", added, a.backend()),
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]SkipReason{}
	for _, s := range res.Skipped {
		got[s.Name] = s.Reason
		if s.Err == nil {
			t.Errorf("%s skipped without an error", s.Name)
		}
	}
	want := map[string]SkipReason{"usurper": SkipAddressConflict, "busy": SkipListenFailed, "invalid": SkipInvalid}
	if !maps.Equal(got, want) {
		t.Errorf("skipped %v, want %v", got, want)
	}
	for _, addr := range []netip.AddrPort{at, added} {
		if err := dialRoundTrip(addr.String()); err != nil {
			t.Errorf("%s does not serve next to the skipped frontends: %v", addr, err)
		}
	}
	if d.Addr("busy") != nil || d.Addr("usurper") != nil {
		t.Error("a skipped frontend exists")
	}

	// Once the port is free, the next apply serves it.
	_ = taken.Close()
	res, err = d.Apply(Config{Frontends: []Frontend{good, tcpFrontend("busy", busy, a.backend())}})
	if err != nil || len(res.Skipped) != 0 {
		t.Fatalf("apply after the port was freed: %v, skipped %v", err, res.Skipped)
	}
	if err := dialRoundTrip(busy.String()); err != nil {
		t.Errorf("the freed port does not serve: %v", err)
	}
}

// A frontend binds its address whether or not the host has it (free-bind):
// the bind itself never fails for want of a configured address.
func TestListenBindsAnAddressTheHostDoesNotHave(t *testing.T) {
	for _, addr := range []string{"192.0.2.10:8080", "[2001:db8::10]:8080"} {
		ap := netip.MustParseAddrPort(addr)
		for _, proto := range []Protocol{TCP, UDP} {
			k := frontendKey{addr: ap, protocol: proto}
			l, err := listenNet(k)
			if err != nil {
				t.Errorf("%s %s: %v", proto, addr, err)
				continue
			}
			_ = l.(interface{ Close() error }).Close()
			if proto == TCP {
				ll, err := listenLoop(k)
				if err != nil {
					t.Errorf("%s %s on the event loop: %v", proto, addr, err)
					continue
				}
				_ = unix.Close(ll.fd)
			}
		}
	}
}

// The owner fast path sets every backend of a node Down at once, across
// frontends, and back to None.
func TestSetOwnerAdminState(t *testing.T) {
	a, b := newTestBackend(t), newTestBackend(t)
	d := newDataPlane(t, Options{})
	one, two := freeAddr(t, "tcp"), freeAddr(t, "tcp")
	ba, bb := a.backend(), b.backend()
	ba.Owner, bb.Owner = "node-1", "node-2"
	mustApply(t, d, tcpFrontend("one", one, ba, bb), tcpFrontend("two", two, ba, bb))
	n, err := d.SetOwnerAdminState("node-1", AdminDown)
	if err != nil || n != 2 {
		t.Fatalf("SetOwnerAdminState = %d, %v; want 2 backends", n, err)
	}
	before := a.accepted.Load()
	for range 10 {
		for _, at := range []string{one.String(), two.String()} {
			if err := dialRoundTrip(at); err != nil {
				t.Fatal(err)
			}
		}
	}
	if a.accepted.Load() != before {
		t.Error("node-1's backend got new connections after SetOwnerAdminState Down")
	}
	for _, s := range d.Status() {
		if want := map[string]AdminState{"node-1": AdminDown, "node-2": AdminNone}[s.Owner]; s.AdminState != want {
			t.Errorf("status of %s on %s: %s, want %s", s.Owner, s.Frontend, s.AdminState, want)
		}
	}
	if _, err := d.SetOwnerAdminState("node-1", "Draining"); err == nil {
		t.Error("an unknown admin state was accepted")
	}
	if _, err := d.SetOwnerAdminState("node-1", AdminNone); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if err := dialRoundTrip(one.String()); err != nil {
			t.Fatal(err)
		}
	}
	if a.accepted.Load() == before {
		t.Error("node-1's backend got no connection after None")
	}
}

// An IPv6 frontend proxies to an IPv4 backend, and the PROXY header then
// carries IPv6 addresses.
func TestIPv6Frontend(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		ln, err := net.Listen("tcp", "[::1]:0")
		if err != nil {
			t.Fatalf("listening on IPv6 loopback: %v", err)
		}
		at := ln.Addr().(*net.TCPAddr).AddrPort()
		ln.Close()
		a := newTestBackend(t)
		d := newDataPlane(t, proxy)
		mustApply(t, d, tcpFrontend("v6", at, a.backend()))
		if err := dialRoundTrip(at.String()); err != nil {
			t.Fatal(err)
		}
		hdr := proxyHeaderV2(at, at)
		if hdr[13] != 0x21 || len(hdr) != 16+36 {
			t.Errorf("PROXY header for IPv6: %x", hdr)
		}
	})
}
