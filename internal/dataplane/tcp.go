package dataplane

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"
)

// maxDialAttempts bounds how many backends one new connection tries that
// do not refuse it at once (a timeout costs the connect timeout each).
// Backends that refuse (a node whose kube-proxy has not programmed a new
// Service's node port yet) cost a round trip each and do not count: every
// eligible backend is tried once per round before the client is refused.
const maxDialAttempts = 3

// refusedHold is how long a new connection is held while every eligible
// backend refuses it, trying them all again every dialRoundPause, before
// the client is reset. A node port refuses when that node's kube-proxy
// has not programmed it yet (a new Service, a new node) or sent the dial
// to a pod that has just stopped listening (its endpoint not yet removed
// everywhere: a rolling update, an eviction). kube-proxy syncs its rules
// at most once per minSyncPeriod, 1 s by default, so a Service's node
// ports may refuse for about a second after ebb serves its address:
// bench-service on real kubelets (2026-11-28) saw resets up to 800 ms after
// the create, and none with kube-proxy's minSyncPeriod at 10 ms. Holding
// the client turns that second of resets into a slower first answer.
// Refusals cost a round trip each; a Service with no eligible backend at
// all is refused at once, not held, and so is a client past maxHeld. The
// hold is counted in rounds, so it may last a little longer (each round's
// dials, and the event loop's 10 ms check).
const refusedHold = 1500 * time.Millisecond

// dialRounds is how many times one new connection may go through the
// eligible backends while they refuse (see refusedHold).
const dialRounds = 1 + int(refusedHold/dialRoundPause)

// dialRoundPause is how long a new connection waits before its next round
// through backends that all refused. The refusals of a round come back to
// back within a millisecond or two, faster than the nodes' kube-proxies
// take a terminated pod's endpoint out; after the pause the node ports may
// have caught up.
const dialRoundPause = 100 * time.Millisecond

// copyChunk is how much one splice call may move before the idle deadline
// is renewed.
const copyChunk = 4 << 20

func (f *frontend) acceptLoop() {
	var backoff time.Duration
	for {
		c, err := f.tcp.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			f.d.log.Error(err, "Accepting a connection", "frontend", f.key.String(), "retryIn", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		go f.handleTCP(c)
	}
}

// handleTCP proxies one client connection to a backend, trying the next
// eligible backend when a dial fails, or refuses it at once when no backend
// is eligible.
func (f *frontend) handleTCP(client *net.TCPConn) {
	set := f.set.Load()
	clientAddr := client.RemoteAddr().(*net.TCPAddr).AddrPort()
	if !set.allowed(clientAddr.Addr()) {
		f.d.m.refused.WithLabelValues(set.cfg.Name, "source_range").Inc()
		refuse(client)
		return
	}
	f.d.looking.Add(1)
	set, b, upstream, refusal := f.dialBackend(set, "tcp", clientAddr.Addr())
	if b != nil {
		f.proxy(set, client, upstream, b, func() { f.d.looking.Add(-1) })
		return
	}
	f.d.looking.Add(-1)
	f.d.m.refused.WithLabelValues(set.cfg.Name, refusal).Inc()
	refuse(client)
}

// dialBackend connects to an eligible backend for a client, trying the
// next one when a dial fails (see maxDialAttempts); with no backend it
// returns why the client is refused (a label of the refused metric).
// Each round after the first takes the frontend's backends as they are
// then (an endpoint change during the hold, such as a replacement pod
// turning ready, is used at once), so it returns the set the backend came
// from; a client the new set would not admit is refused.
func (f *frontend) dialBackend(set *backendSet, network string, client netip.Addr) (*backendSet, *backend, net.Conn, string) {
	var tried []*backend // allocated only once a dial failed
	for slow, round := 0, 1; slow < maxDialAttempts; {
		b := set.choose(client, tried)
		if b == nil {
			if len(tried) == 0 || round == dialRounds {
				return set, nil, nil, "no_backend"
			}
			if network == "tcp" { // a UDP dial is never refused
				if !f.d.takeHold() {
					return set, nil, nil, "hold_limit"
				}
				time.Sleep(dialRoundPause)
				f.d.releaseHold()
			}
			next := f.set.Load()
			if !next.admits(set, client) {
				return set, nil, nil, "source_range" // counted for the client's Service
			}
			round, tried, set = round+1, tried[:0], next
			continue
		}
		conn, err := f.d.dial(connectDeadline{time.Now().Add(set.cfg.ConnectTimeout.Duration)}, network, b.addr)
		if err == nil {
			return set, b, conn, ""
		}
		tried = append(tried, b)
		b.m.dialErrors.Inc()
		f.d.log.V(4).Info("Dialing a backend failed", "frontend", set.cfg.Name, "backend", b.addr, "err", err.Error())
		if !errors.Is(err, syscall.ECONNREFUSED) {
			slow++
		}
	}
	return set, nil, nil, "no_backend"
}

// maxHeld bounds the connections held between rounds at once, over every
// frontend. Anyone who can reach an address can open connections, and a
// Service whose node ports all refuse (scaled to zero, crash-looping)
// would otherwise keep each for refusedHold, dialling every node each
// round; past the bound a client is reset at once, as before the hold.
const maxHeld = 1024

// takeHold reserves one of maxHeld places for a connection about to pause
// between rounds; false when none is left.
func (d *DataPlane) takeHold() bool {
	if d.held.Add(1) > maxHeld {
		d.held.Add(-1)
		return false
	}
	return true
}

// releaseHold gives a place back once the pause is over.
func (d *DataPlane) releaseHold() { d.held.Add(-1) }

// connectDeadline is the context of a dial to a backend: a deadline and
// nothing else. net.Dialer bounds the connect with the socket's write
// deadline, a runtime timer it arms anyway; context.WithTimeout would add a
// second timer per dial. It is never cancelled, and says so to
// context.AfterFunc (which net.Dialer calls) so that no goroutine waits on
// its Done channel.
type connectDeadline struct{ at time.Time }

func (c connectDeadline) Deadline() (time.Time, bool) { return c.at, true }
func (connectDeadline) Done() <-chan struct{}         { return neverDone }
func (connectDeadline) Err() error                    { return nil }
func (connectDeadline) Value(any) any                 { return nil }

// AfterFunc never runs f: the context is never cancelled (its deadline is
// enforced on the socket).
func (connectDeadline) AfterFunc(func()) (stop func() bool) { return stopNever }

func stopNever() bool { return true }

// neverDone is the Done channel of every connectDeadline: never closed and
// never sent on, so sharing it is safe.
var neverDone = make(chan struct{})

// refuse closes a client connection with a reset, so that the client fails
// fast instead of waiting.
func refuse(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

// proxy copies both ways between client and upstream until both sides are
// done, then closes them. found is called once the connection is in the
// connection table (so that Connections never misses it in between).
func (f *frontend) proxy(set *backendSet, client *net.TCPConn, upstream net.Conn, b *backend, found func()) {
	if ka := set.cfg.TCPKeepAlive.Duration; ka > 0 {
		setKeepAlive(client, ka)
		setKeepAlive(upstream, ka)
	}
	c := &tcpConn{ends: netConns{client, upstream}, backend: b, idleTimeout: set.cfg.IdleTimeout.Duration, quietSince: f.d.clock.Now()}
	f.d.conns.add(c)
	found()
	b.active.Add(1)
	b.m.active.Inc()
	b.m.total.Inc()
	defer func() {
		f.d.conns.remove(c)
		b.active.Add(-1)
		b.m.active.Dec()
		c.close()
	}()
	if set.cfg.ProxyProtocol {
		hdr := proxyHeaderV2(client.RemoteAddr().(*net.TCPAddr).AddrPort(), client.LocalAddr().(*net.TCPAddr).AddrPort())
		if _, err := upstream.Write(hdr); err != nil {
			return
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		n := proxyCopy(upstream, client, c)
		b.m.toBackend.Add(float64(n))
	}()
	n := proxyCopy(client, upstream, c)
	b.m.toClient.Add(float64(n))
	<-done
}

// keepAliveConfig is the TCP keep-alive of a frontend's connections: a
// probe after idle of quiet, then every fifth of it (at least a second),
// and the connection ends after 5 unanswered. The probes cost four system
// calls per socket to set up, so they are set only when configured.
func keepAliveConfig(idle time.Duration) net.KeepAliveConfig {
	return net.KeepAliveConfig{Enable: true, Idle: idle, Interval: max(idle/5, time.Second), Count: 5}
}

// setKeepAlive sets keepAliveConfig(idle) on a net.Conn.
func setKeepAlive(c net.Conn, idle time.Duration) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetKeepAliveConfig(keepAliveConfig(idle))
	}
}

// smallRead is the buffer of the first reads of a direction. A read that
// fills it marks the direction as bulk, which then moves to splice.
const smallRead = 16 << 10

var smallBufs = sync.Pool{New: func() any { b := make([]byte, smallRead); return &b }}

// proxyCopy copies src to dst until src ends, then half-closes dst so the
// far end sees the end of the stream (and may still answer). It returns the
// number of bytes copied. On an error, both sides are closed, which also
// ends the copy in the other direction.
//
// Like HAProxy's splice-auto, small messages go through read and write with
// no deadline (the connection table's sweeper ends idle connections), and
// once a read fills the buffer the direction moves to the kernel's splice
// path until it has been quiet for a whole idle timeout.
func proxyCopy(dst, src net.Conn, c *tcpConn) int64 {
	var total int64
	bufp := smallBufs.Get().(*[]byte)
	defer smallBufs.Put(bufp)
	buf := *bufp
	for {
		m, err := src.Read(buf)
		if m > 0 {
			c.activity.Add(1)
			total += int64(m)
			if _, werr := dst.Write(buf[:m]); werr != nil {
				err = werr
			} else if m == len(buf) && err == nil {
				var n int64
				n, err = spliceCopy(dst, src, c)
				total += n
			}
		}
		switch {
		case err == nil:
			continue
		case errors.Is(err, io.EOF):
			// End of stream from src: pass the half-close on, unless the
			// other direction has ended too (then both sides close now,
			// and close sends the FIN).
			if c.eofs.Add(1) < 2 {
				if tcp, ok := dst.(interface{ CloseWrite() error }); ok {
					_ = tcp.CloseWrite()
				} else {
					_ = dst.Close()
				}
			}
			return total
		}
		c.close()
		return total
	}
}

// spliceCopy moves a bulk direction by splice (io.Copy between two
// *net.TCPConn) in chunks, each under a read deadline of the idle timeout,
// until src ends (io.EOF) or has been quiet for a whole idle timeout (nil:
// back to small reads, under the sweeper).
func spliceCopy(dst, src net.Conn, c *tcpConn) (int64, error) {
	c.bulk.Add(1)
	defer func() {
		_ = src.SetReadDeadline(time.Time{})
		c.bulk.Add(-1)
	}()
	var total int64
	for {
		_ = src.SetReadDeadline(time.Now().Add(c.idleTimeout))
		// A LimitedReader around a *net.TCPConn still splices; the limit
		// lets the deadline be renewed on a busy connection.
		n, err := io.Copy(dst, &io.LimitedReader{R: src, N: copyChunk})
		total += n
		switch {
		case err == nil && n < copyChunk:
			return total, io.EOF
		case err == nil, errors.Is(err, os.ErrDeadlineExceeded) && n > 0:
			continue // traffic in this window
		case errors.Is(err, os.ErrDeadlineExceeded):
			return total, nil
		default:
			return total, err
		}
	}
}
