package handoff

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
)

// address is an abstract name of the test's own.
func address(t *testing.T) string {
	return fmt.Sprintf("@ebb-handoff-test-%d-%s", os.Getpid(), t.Name())
}

// listenerFiles returns a function giving duplicates of the listeners.
func listenerFiles(lns ...*net.TCPListener) func() ([]*os.File, error) {
	return func() ([]*os.File, error) {
		var out []*os.File
		for _, ln := range lns {
			f, err := ln.File()
			if err != nil {
				return nil, err
			}
			out = append(out, f)
		}
		return out, nil
	}
}

func serveAsync(t *testing.T, log logr.Logger, addr string, sockets func() ([]*os.File, error)) <-chan *Successor {
	t.Helper()
	offer, err := Listen(log, addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	out := make(chan *Successor, 1)
	go func() {
		s, err := offer.Serve(ctx, sockets)
		if err != nil {
			t.Log(err)
		}
		out <- s
	}()
	return out
}

// A connection waiting in the accept queue when the sockets move is
// accepted by the successor: the socket is the same, so nothing is lost.
func TestQueuedConnectionIsAcceptedByTheSuccessor(t *testing.T) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	successors := serveAsync(t, testr.New(t), address(t), listenerFiles(ln))

	// Queued before the hand-off, never accepted by the predecessor.
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	ctx := context.Background()
	taken, err := Take(ctx, address(t))
	if err != nil || taken == nil {
		t.Fatalf("Take: %v, %v", taken, err)
	}
	if len(taken.Files) != 1 || taken.PID != os.Getpid() {
		t.Fatalf("took %d sockets from pid %d", len(taken.Files), taken.PID)
	}
	l, err := net.FileListener(taken.Files[0])
	if err != nil {
		t.Fatal(err)
	}
	taken.Files[0].Close()
	defer l.Close()

	released := make(chan error, 1)
	go func() { released <- taken.Serving(ctx) }()
	s := <-successors
	if s == nil {
		t.Fatal("the predecessor saw no successor")
	}
	ln.Close() // the predecessor stops accepting: its descriptor only
	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
	if err := <-released; err != nil {
		t.Fatalf("Serving: %v", err)
	}

	_ = l.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	c, err := l.Accept()
	if err != nil {
		t.Fatalf("the successor did not get the queued connection: %v", err)
	}
	defer c.Close()
	if _, err := client.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(buf); err != nil || buf[0] != 'x' {
		t.Fatalf("read %q, %v", buf, err)
	}
	// And new connections reach the successor too.
	c2, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("a new connection after the hand-off: %v", err)
	}
	c2.Close()
}

// A successor that goes away before it serves changes nothing: the
// predecessor offers again, and the next successor takes over.
func TestASuccessorThatGoesAwayChangesNothing(t *testing.T) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	successors := serveAsync(t, testr.New(t), address(t), listenerFiles(ln))
	ctx := context.Background()

	first, err := Take(ctx, address(t))
	if err != nil || first == nil {
		t.Fatalf("Take: %v, %v", first, err)
	}
	closeAll(first.Files)
	first.Abort()

	var second *Taken
	for deadline := time.Now().Add(5 * time.Second); second == nil; {
		if second, err = Take(ctx, address(t)); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the predecessor stopped offering after a successor went away")
		}
	}
	defer closeAll(second.Files)
	select {
	case s := <-successors:
		t.Fatalf("Serve returned %v before anyone served", s)
	default:
	}
	go func() { _ = second.Serving(ctx) }()
	s := <-successors
	if s == nil {
		t.Fatal("Serve returned no successor")
	}
	_ = s.Release()
}

func TestNobodyOffers(t *testing.T) {
	for _, addr := range []string{address(t), filepath.Join(t.TempDir(), "none.sock")} {
		taken, err := Take(context.Background(), addr)
		if taken != nil || err != nil {
			t.Errorf("Take(%s) = %v, %v; want nothing, no error", addr, taken, err)
		}
	}
}

// A path left by a process that is gone is replaced; a live one is not.
func TestListenOnAPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lb.sock")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	offer, err := Listen(testr.New(t), path)
	if err != nil {
		t.Fatalf("a stale file was not replaced: %v", err)
	}
	defer offer.Close()
	if _, err := Listen(testr.New(t), path); err == nil {
		t.Fatal("a second process listened where a live one offers")
	}
}

// More sockets than one message carries arrive in batches, every one.
func TestManySockets(t *testing.T) {
	const n = 2*maxBatch + 7
	var conns []*net.UDPConn
	for range n {
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	sockets := func() ([]*os.File, error) {
		var out []*os.File
		for _, c := range conns {
			f, err := c.File()
			if err != nil {
				return nil, err
			}
			out = append(out, f)
		}
		return out, nil
	}
	successors := serveAsync(t, logr.Discard(), address(t), sockets)
	taken, err := Take(context.Background(), address(t))
	if err != nil || taken == nil {
		t.Fatalf("Take: %v, %v", taken, err)
	}
	defer closeAll(taken.Files)
	if len(taken.Files) != n {
		t.Fatalf("took %d sockets, want %d", len(taken.Files), n)
	}
	// Each is the same socket: the same local address, in the same order.
	for i, f := range taken.Files {
		pc, err := net.FilePacketConn(f)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := pc.LocalAddr().String(), conns[i].LocalAddr().String(); got != want {
			t.Fatalf("socket %d is %s, want %s", i, got, want)
		}
		pc.Close()
	}
	go func() { _ = taken.Serving(context.Background()) }()
	if s := <-successors; s != nil {
		_ = s.Release()
	}
}

// A successor that takes the sockets and never says it serves holds the
// offer for the serving timeout only: the next one takes over. Before the
// timeout, one such client blocked every later upgrade.
func TestASuccessorThatNeverServesDoesNotBlockTheNext(t *testing.T) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	offer, err := Listen(testr.New(t), address(t))
	if err != nil {
		t.Fatal(err)
	}
	offer.servingTimeout = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	successors := make(chan *Successor, 1)
	go func() {
		s, _ := offer.Serve(ctx, listenerFiles(ln))
		successors <- s
	}()
	stuck, err := Take(ctx, address(t))
	if err != nil || stuck == nil {
		t.Fatalf("Take: %v, %v", stuck, err)
	}
	defer stuck.Abort()
	closeAll(stuck.Files)

	next, err := Take(ctx, address(t))
	if err != nil || next == nil {
		t.Fatalf("the next successor: %v, %v", next, err)
	}
	closeAll(next.Files)
	released := make(chan error, 1)
	go func() { released <- next.Serving(ctx) }()
	select {
	case s := <-successors:
		if s == nil {
			t.Fatal("no successor")
		}
		if err := s.Release(); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the next successor was not served while the first never answered")
	}
	if err := <-released; err != nil {
		t.Fatal(err)
	}
}
