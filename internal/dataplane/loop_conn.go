package dataplane

import (
	"errors"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// loopConnState is where a connection of the event loop is in its life.
type loopConnState uint8

const (
	connConnecting loopConnState = iota // the client is accepted, a backend's connect is in flight
	connOpen                            // both sides connected: bytes move
	connClosed
)

// sideEvents are the events every socket of a connection is registered
// for. Edge-triggered: a side remembers what it was told (readable,
// writable) until a read or write says otherwise.
const sideEvents = unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET

// loopConn is one client connection on the event loop and its backend's.
type loopConn struct {
	l       *eventLoop
	f       *frontend
	set     *backendSet
	from    netip.AddrPort // the client
	state   loopConnState
	backend *backend
	tc      tcpConn // in the connection table once open (one allocation with the connection)

	client, upstream loopSide

	// The backends tried so far, the slow failures among them and the
	// rounds through them (see dialBackend), and the connect's deadline.
	tried    []*backend
	slow     int
	round    int
	deadline time.Time
	// holding is set while the connection pauses between rounds, in one
	// of the data plane's maxHeld places.
	holding bool
	// looking is set from the accept until the connection is
	// established or closed: it counts in the data plane's looking.
	looking bool
	at      int // index in l.connecting while connecting
}

// loopSide is one socket of a connection and the direction of bytes read
// from it.
type loopSide struct {
	conn *loopConn
	fd   int

	readable, writable bool
	// rdhup: the peer has sent its FIN, so a read short of the buffer
	// has taken everything there will be.
	rdhup bool
	// eof: everything from this side has been read; shut: the other side
	// has been told (half-closed), or the connection is closing.
	eof, shut bool
	// pending is what was read from this side and the other side could not
	// take yet; it lives in own (pooled).
	pending []byte
	own     *[]byte
	bytes   int64
}

var pendingBufs = sync.Pool{New: func() any { b := make([]byte, loopReadSize); return &b }}

// peer is the other side of the connection.
func (s *loopSide) peer() *loopSide {
	if s == &s.conn.client {
		return &s.conn.upstream
	}
	return &s.conn.client
}

// newConn takes an accepted client connection: refused at once when the
// source ranges exclude it, else on to a backend.
func (l *eventLoop) newConn(f *frontend, fd int, from netip.AddrPort) {
	set := f.set.Load()
	if !set.allowed(from.Addr()) {
		f.d.m.refused.WithLabelValues(set.cfg.Name, "source_range").Inc()
		resetClose(fd)
		return
	}
	c := &loopConn{l: l, f: f, set: set, from: from, round: 1}
	c.client = loopSide{conn: c, fd: fd}
	c.upstream = loopSide{conn: c, fd: -1}
	if err := l.add(fd, sideEvents, &c.client); err != nil {
		l.d.log.Error(err, "Taking a connection", "frontend", f.key.String())
		resetClose(fd)
		return
	}
	c.looking = true
	l.d.looking.Add(1)
	l.dial(c)
}

// dial starts a connect to the next eligible backend, or refuses the client
// when none is left (see dialBackend for the rules).
func (l *eventLoop) dial(c *loopConn) {
	for c.slow < maxDialAttempts {
		b := c.set.choose(c.from.Addr(), c.tried)
		if b == nil {
			if len(c.tried) == 0 || c.round == dialRounds {
				break
			}
			// The next round starts after dialRoundPause: the
			// connection waits among the connects in flight, with no
			// socket, until checkConnects finds its deadline passed.
			if !l.d.takeHold() {
				c.f.d.m.refused.WithLabelValues(c.set.cfg.Name, "hold_limit").Inc()
				l.refuse(c)
				return
			}
			c.holding = true
			c.round, c.tried = c.round+1, c.tried[:0]
			c.deadline = time.Now().Add(dialRoundPause)
			l.startConnect(c)
			return
		}
		fd, err := connectTo(b.key)
		if err == nil {
			err = l.add(fd, sideEvents, &c.upstream)
			if err != nil {
				_ = sysClose(fd)
			}
		}
		if err == nil {
			c.backend, c.upstream.fd = b, fd
			c.deadline = time.Now().Add(c.set.cfg.ConnectTimeout.Duration)
			l.startConnect(c)
			return
		}
		c.dialFailed(b, err)
	}
	c.f.d.m.refused.WithLabelValues(c.set.cfg.Name, "no_backend").Inc()
	l.refuse(c)
}

// refuse closes a client connection that found no backend with a reset,
// so that the client fails fast instead of waiting.
func (l *eventLoop) refuse(c *loopConn) {
	c.endLooking()
	c.state = connClosed
	setResetOnClose(c.client.fd)
	l.closeFD(c.client.fd)
	c.client.fd = -1
}

// connectTo opens a non-blocking socket with TCP_NODELAY and starts its
// connect.
func connectTo(to netip.AddrPort) (int, error) {
	fd, err := sysSocket(socketFamily(to))
	if err != nil {
		return -1, err
	}
	if err := sysSetsockoptInt(fd, unix.SOL_TCP, unix.TCP_NODELAY, 1); err != nil {
		_ = sysClose(fd)
		return -1, err
	}
	if err := sysConnect(fd, to); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		_ = sysClose(fd)
		return -1, err
	}
	return fd, nil
}

// dialFailed counts a failed connect to b.
func (c *loopConn) dialFailed(b *backend, err error) {
	c.tried = append(c.tried, b)
	b.m.dialErrors.Inc()
	c.f.d.log.V(4).Info("Dialing a backend failed", "frontend", c.set.cfg.Name, "backend", b.addr, "err", err.Error())
	if !errors.Is(err, unix.ECONNREFUSED) {
		c.slow++
	}
}

func (l *eventLoop) startConnect(c *loopConn) {
	c.at = len(l.connecting)
	l.connecting = append(l.connecting, c)
	if len(l.connecting) == 1 {
		l.nextCheck = time.Now().Add(connectCheckInterval)
	}
}

func (l *eventLoop) endConnect(c *loopConn) {
	last := l.connecting[len(l.connecting)-1]
	l.connecting[c.at] = last
	last.at = c.at
	l.connecting[len(l.connecting)-1] = nil
	l.connecting = l.connecting[:len(l.connecting)-1]
}

// checkConnects fails the connects past their timeout.
func (l *eventLoop) checkConnects() {
	if len(l.connecting) == 0 {
		return
	}
	now := time.Now()
	if now.Before(l.nextCheck) {
		return
	}
	l.nextCheck = now.Add(connectCheckInterval)
	for i := 0; i < len(l.connecting); {
		c := l.connecting[i]
		if now.Before(c.deadline) {
			i++
			continue
		}
		if c.upstream.fd < 0 { // paused between rounds (see dial)
			l.endConnect(c) // takes c out of l.connecting at i
			c.endHold()
			// The next round goes through the backends as they are
			// now: an endpoint change during the pause is used at once,
			// and a client the new set would not admit is refused.
			next := c.f.set.Load()
			if !next.admits(c.set, c.from.Addr()) {
				c.f.d.m.refused.WithLabelValues(c.set.cfg.Name, "source_range").Inc()
				l.refuse(c)
				continue
			}
			c.set = next
			l.dial(c)
			continue
		}
		l.connectFailed(c, unix.ETIMEDOUT) // takes c out of l.connecting at i
	}
}

// connectFailed closes a failed connect's socket and tries the next
// backend.
func (l *eventLoop) connectFailed(c *loopConn, err error) {
	l.endConnect(c)
	l.closeFD(c.upstream.fd)
	c.upstream = loopSide{conn: c, fd: -1}
	c.dialFailed(c.backend, err)
	c.backend = nil
	l.dial(c)
}

// event handles epoll's events for one side of a connection.
func (s *loopSide) event(l *eventLoop, ev uint32) {
	c := s.conn
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		s.readable = true
	}
	if ev&unix.EPOLLRDHUP != 0 {
		s.rdhup = true
	}
	if c.state == connConnecting {
		if s == &c.upstream {
			l.connectDone(c, ev)
		}
		return // the client's events wait for the backend
	}
	if ev&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		s.writable = true
		l.pump(s.peer()) // what waited for this side to take it
	}
	l.pump(s)
}

// connectDone finishes a backend's connect: the socket is writable when
// connected, and in error when not (epoll's flags say which, so no
// getsockopt is needed when it worked).
func (l *eventLoop) connectDone(c *loopConn, ev uint32) {
	if ev&(unix.EPOLLERR|unix.EPOLLHUP) != 0 {
		errno, err := unix.GetsockoptInt(c.upstream.fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err == nil {
			err = unix.Errno(errno)
		}
		l.connectFailed(c, err)
		return
	}
	if ev&unix.EPOLLOUT == 0 {
		return
	}
	l.endConnect(c)
	l.established(c)
}

// established starts moving bytes on a connected connection.
func (l *eventLoop) established(c *loopConn) {
	c.state = connOpen
	c.upstream.writable, c.client.writable = true, true
	cfg := &c.set.cfg
	b := c.backend
	if ka := cfg.TCPKeepAlive.Duration; ka > 0 {
		setKeepAliveFD(c.client.fd, ka)
		setKeepAliveFD(c.upstream.fd, ka)
	}
	c.tc.ends, c.tc.backend = c, b
	c.tc.idleTimeout, c.tc.quietSince = cfg.IdleTimeout.Duration, c.f.d.clock.Now()
	c.f.d.conns.add(&c.tc)
	c.endLooking()
	b.active.Add(1)
	b.m.active.Inc()
	b.m.total.Inc()
	if cfg.ProxyProtocol {
		local, err := sysGetsockname(c.client.fd)
		if err != nil {
			l.closeConn(c)
			return
		}
		c.client.keep(proxyHeaderV2(c.from, local))
	}
	l.pump(&c.client)
	if c.state == connOpen {
		l.pump(&c.upstream)
	}
}

// pump moves what src has to its peer until src has nothing more for now,
// the peer can take no more, or the direction has ended (then it passes the
// end on).
func (l *eventLoop) pump(src *loopSide) {
	c := src.conn
	dst := src.peer()
	for c.state == connOpen && !src.shut {
		if len(src.pending) > 0 {
			if !dst.writable {
				return
			}
			n, err := sysWrite(dst.fd, src.pending)
			if err != nil && !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
				l.closeConn(c)
				return
			}
			src.pending = src.pending[max(n, 0):]
			if len(src.pending) > 0 {
				dst.writable = false // full: its EPOLLOUT edge comes when it drains
				return
			}
			src.release()
		}
		if src.eof {
			l.endDirection(src)
			return
		}
		if !src.readable {
			return
		}
		n, err := sysRead(src.fd, l.buf)
		switch {
		case n > 0:
			c.tc.activity.Add(1)
			src.bytes += int64(n)
			if n < len(l.buf) {
				// Short: the socket is empty. Wait for its next edge
				// instead of reading into EAGAIN; and if its peer's FIN
				// had come, there is nothing more at all.
				src.readable = false
				src.eof = src.rdhup
			}
			l.forward(src, dst, l.buf[:n])
		case n == 0 && err == nil:
			src.eof = true
		case errors.Is(err, unix.EAGAIN):
			src.readable = false
			return
		case errors.Is(err, unix.EINTR):
		default:
			l.closeConn(c)
			return
		}
	}
}

// forward writes what was just read from src (in the loop's buffer) to
// dst, keeping what dst cannot take yet.
func (l *eventLoop) forward(src, dst *loopSide, b []byte) {
	if dst.writable {
		n, err := sysWrite(dst.fd, b)
		if err != nil && !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			l.closeConn(src.conn)
			return
		}
		b = b[max(n, 0):]
		if len(b) == 0 {
			return
		}
		dst.writable = false
	}
	src.keep(b)
}

// keep copies b into the side's own pending buffer.
func (s *loopSide) keep(b []byte) {
	if s.own == nil {
		s.own = pendingBufs.Get().(*[]byte)
	}
	s.pending = append((*s.own)[:0], b...)
}

// release returns the side's pending buffer to the pool.
func (s *loopSide) release() {
	if s.own != nil {
		pendingBufs.Put(s.own)
		s.own, s.pending = nil, nil
	}
}

// endDirection passes the end of src's stream on: a half-close of its
// peer, unless the other direction has ended too (then the connection
// closes, and close sends the FIN).
func (l *eventLoop) endDirection(src *loopSide) {
	src.shut = true
	dst := src.peer()
	if dst.shut {
		l.closeConn(src.conn)
		return
	}
	if err := sysShutdown(dst.fd, unix.SHUT_WR); err != nil {
		l.closeConn(src.conn)
	}
}

// closeConn closes both sides of a connection and settles its counts.
func (l *eventLoop) closeConn(c *loopConn) {
	c.endHold()
	c.endLooking()
	switch c.state {
	case connClosed:
		return
	case connConnecting:
		l.endConnect(c)
	}
	wasOpen := c.state == connOpen
	c.state = connClosed
	for _, s := range []*loopSide{&c.client, &c.upstream} {
		if s.fd >= 0 {
			l.closeFD(s.fd)
			s.fd = -1
		}
		s.release()
	}
	if !wasOpen {
		return
	}
	b := c.backend
	c.f.d.conns.remove(&c.tc)
	b.active.Add(-1)
	b.m.active.Dec()
	b.m.toBackend.Add(float64(c.client.bytes))
	b.m.toClient.Add(float64(c.upstream.bytes))
}

// close asks the loop to close the connection (the idle sweeper, a drain's
// timeout, Close).
func (c *loopConn) close() {
	c.l.do(func() { c.l.closeConn(c) })
}

// resetClose closes a client connection with a reset, so that the client
// fails fast instead of waiting.
func resetClose(fd int) {
	setResetOnClose(fd)
	_ = sysClose(fd)
}

// setKeepAliveFD sets keepAliveConfig(idle) on a raw socket.
func setKeepAliveFD(fd int, idle time.Duration) {
	ka := keepAliveConfig(idle)
	secs := func(d time.Duration) int { return max(int(d/time.Second), 1) }
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_TCP, unix.TCP_KEEPIDLE, secs(ka.Idle))
	_ = unix.SetsockoptInt(fd, unix.SOL_TCP, unix.TCP_KEEPINTVL, secs(ka.Interval))
	_ = unix.SetsockoptInt(fd, unix.SOL_TCP, unix.TCP_KEEPCNT, ka.Count)
}

// endLooking takes the connection out of the data plane's count of those
// looking for a backend, if it is in it.
func (c *loopConn) endLooking() {
	if c.looking {
		c.looking = false
		c.f.d.looking.Add(-1)
	}
}

// endHold gives back the connection's place among the held ones, if it
// has one.
func (c *loopConn) endHold() {
	if c.holding {
		c.holding = false
		c.f.d.releaseHold()
	}
}
