package dataplane

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/loopback"
)

// testBackend is a TCP echo server on loopback that counts connections.
type testBackend struct {
	ln       net.Listener
	accepted atomic.Int64
	mu       sync.Mutex
	conns    []net.Conn
	// onAccept, if set, runs on each new connection before the echo.
	onAccept func(net.Conn)
}

func newTestBackend(t *testing.T, onAccept ...func(net.Conn)) *testBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveEcho(t, ln, onAccept...)
}

// serveEcho echoes on every connection ln accepts until the test ends.
func serveEcho(t *testing.T, ln net.Listener, onAccept ...func(net.Conn)) *testBackend {
	b := &testBackend{ln: ln}
	if len(onAccept) > 0 {
		b.onAccept = onAccept[0]
	}
	t.Cleanup(b.close)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.accepted.Add(1)
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
			go func() {
				if b.onAccept != nil {
					b.onAccept(c)
				}
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	return b
}

// lastPeer is the address the last accepted connection came from.
func (b *testBackend) lastPeer() netip.AddrPort {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.conns) == 0 {
		return netip.AddrPort{}
	}
	return b.conns[len(b.conns)-1].RemoteAddr().(*net.TCPAddr).AddrPort()
}

func (b *testBackend) close() {
	_ = b.ln.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		_ = c.Close()
	}
}

func (b *testBackend) backend() Backend {
	ap := b.ln.Addr().(*net.TCPAddr).AddrPort()
	return Backend{Address: ap.Addr().String(), Port: ap.Port(), Owner: "node-" + ap.String()}
}

// freeAddr returns a loopback address and port free a moment ago, on an
// address of its own (see loopback.FreeAddr).
func freeAddr(t *testing.T, network string) netip.AddrPort {
	t.Helper()
	at, err := loopback.FreeAddr(network)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

func newDataPlane(t *testing.T, opts Options) *DataPlane {
	t.Helper()
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func tcpFrontend(name string, at netip.AddrPort, backends ...Backend) Frontend {
	return Frontend{Name: name, Address: at.Addr().String(), Port: at.Port(), Backends: backends}
}

func mustApply(t *testing.T, d *DataPlane, fs ...Frontend) {
	t.Helper()
	if err := applyAll(d, Config{Frontends: fs}); err != nil {
		t.Fatal(err)
	}
}

// roundTrip writes msg and reads it back within 5 s (more than refusedHold,
// so that a held connection is not taken for a lost one).
func roundTrip(c net.Conn, msg []byte) error {
	if _, err := c.Write(msg); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if string(got) != string(msg) {
		return errors.New("echo differs from what was sent")
	}
	return nil
}

// dialRoundTrip opens a new connection to addr and does one round trip.
func dialRoundTrip(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	return roundTrip(c, []byte("hello"))
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// applyAll applies cfg and fails if any frontend was skipped.
func applyAll(d *DataPlane, cfg Config) error {
	res, err := d.Apply(cfg)
	if err != nil {
		return err
	}
	return res.Err()
}

// probeRounds is how many probe results every one of d's probers has
// recorded at least: after a clock step, it grows once each prober has
// probed and recorded the result.
func probeRounds(d *DataPlane) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var n uint64
	first := true
	for _, p := range d.probers {
		if r := p.results.Load(); first || r < n {
			n, first = r, false
		}
	}
	return n
}

// bothProxies runs a test of the proxy engine's TCP connections on the
// event loop and on goroutines (Options.GoroutineProxy), with the options
// to start the data plane with.
func bothProxies(t *testing.T, test func(t *testing.T, proxy Options)) {
	for _, goroutines := range []bool{false, true} {
		name := "loop"
		if goroutines {
			name = "goroutines"
		}
		t.Run(name, func(t *testing.T) { test(t, Options{GoroutineProxy: goroutines}) })
	}
}
