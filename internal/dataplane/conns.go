package dataplane

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// idleSweepInterval is how often idle TCP connections are looked for: a
// connection ends between IdleTimeout and IdleTimeout plus two of these
// after its last byte.
const idleSweepInterval = time.Second

// tcpConn is one proxied TCP connection: the client's side and the
// backend's.
type tcpConn struct {
	ends        connEnds
	backend     *backend
	idleTimeout time.Duration

	// activity counts reads that moved data, in both directions; the
	// sweeper compares it between rounds instead of every read renewing a
	// deadline (a runtime timer update per read).
	activity atomic.Uint64
	// bulk counts directions in bulk (splice) mode: they watch their own
	// idleness with a deadline per chunk, and the sweeper leaves the
	// connection alone meanwhile.
	bulk atomic.Int32
	// eofs counts directions that ended with the end of their stream; the
	// second one need not half-close, the whole connection closes next.
	eofs atomic.Int32

	// Set when the connection is added, then only the sweeper reads and
	// writes these.
	seen       uint64
	quietSince time.Time
}

// connEnds is what closes a connection's two sockets: netConns for a
// connection of goroutines, *loopConn for one on the event loop.
type connEnds interface{ close() }

// close ends both sides.
func (c *tcpConn) close() { c.ends.close() }

// netConns are the two sides of a connection of goroutines.
type netConns struct{ client, upstream net.Conn }

func (n netConns) close() {
	_ = n.client.Close()
	_ = n.upstream.Close()
}

// connTable holds the established TCP connections of a data plane, for
// the idle sweeper, drains with a timeout and Close.
type connTable struct {
	mu    sync.Mutex
	conns map[*tcpConn]struct{}
	// sweeps counts finished sweeps, so that a test can wait for one.
	sweeps atomic.Uint64
}

func newConnTable() *connTable {
	return &connTable{conns: map[*tcpConn]struct{}{}}
}

func (t *connTable) add(c *tcpConn) {
	t.mu.Lock()
	t.conns[c] = struct{}{}
	t.mu.Unlock()
}

func (t *connTable) remove(c *tcpConn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
}

// len counts the connections.
func (t *connTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns)
}

// snapshot lists the connections that match, without holding the lock
// while they are looked at or closed.
func (t *connTable) snapshot(match func(*tcpConn) bool) []*tcpConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*tcpConn, 0, len(t.conns))
	for c := range t.conns {
		if match == nil || match(c) {
			out = append(out, c)
		}
	}
	return out
}

// closeBackend ends every established connection of a backend.
func (t *connTable) closeBackend(b *backend) {
	for _, c := range t.snapshot(func(c *tcpConn) bool { return c.backend == b }) {
		c.close()
	}
}

// closeAll ends every established connection.
func (t *connTable) closeAll() {
	for _, c := range t.snapshot(nil) {
		c.close()
	}
}

// sweep closes the connections that have moved nothing in either direction
// for their idle timeout. A connection's quiet period starts when it is
// established, and again at each sweep that sees its activity count moved.
func (t *connTable) sweep(now time.Time) (closed int) {
	for _, c := range t.snapshot(nil) {
		a := c.activity.Load()
		switch {
		case a != c.seen || c.bulk.Load() > 0:
			c.seen, c.quietSince = a, now
		case now.Sub(c.quietSince) >= c.idleTimeout:
			c.close()
			closed++
		}
	}
	return closed
}

// sweepIdle runs sweep every idleSweepInterval until stop is closed.
func (t *connTable) sweepIdle(clk Clock, stop <-chan struct{}) {
	ticker := clk.NewTicker(idleSweepInterval)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C():
			t.sweep(clk.Now())
			t.sweeps.Add(1)
		}
	}
}
