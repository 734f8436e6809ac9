package dataplane

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// maxDialAttempts bounds how many backends one new connection tries.
const maxDialAttempts = 3

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
	if b, upstream := f.dialBackend(set, "tcp", clientAddr.Addr()); b != nil {
		f.proxy(set, client, upstream, b)
		return
	}
	f.d.m.refused.WithLabelValues(set.cfg.Name, "no_backend").Inc()
	refuse(client)
}

// dialBackend connects to an eligible backend for a client, trying the
// next one when a dial fails, up to maxDialAttempts; nil when none
// answers.
func (f *frontend) dialBackend(set *backendSet, network string, client netip.Addr) (*backend, net.Conn) {
	var tried [maxDialAttempts]*backend
	for attempt := range maxDialAttempts {
		b := set.choose(client, tried[:attempt])
		if b == nil {
			return nil, nil
		}
		tried[attempt] = b
		ctx, cancel := context.WithTimeout(context.Background(), set.cfg.ConnectTimeout.Duration)
		conn, err := f.d.dial(ctx, network, b.addr)
		cancel()
		if err != nil {
			b.m.dialErrors.Inc()
			f.d.log.V(4).Info("Dialing a backend failed", "frontend", set.cfg.Name, "backend", b.addr, "err", err.Error())
			continue
		}
		return b, conn
	}
	return nil, nil
}

// refuse closes a client connection with a reset, so that the client fails
// fast instead of waiting.
func refuse(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

// proxy copies both ways between client and upstream until both sides are
// done, then closes them.
func (f *frontend) proxy(set *backendSet, client *net.TCPConn, upstream net.Conn, b *backend) {
	b.track(client, upstream)
	b.active.Add(1)
	b.m.active.Inc()
	b.m.total.Inc()
	defer func() {
		b.untrack(client, upstream)
		b.active.Add(-1)
		b.m.active.Dec()
		_ = client.Close()
		_ = upstream.Close()
	}()
	if set.cfg.ProxyProtocol {
		hdr := proxyHeaderV2(client.RemoteAddr().(*net.TCPAddr).AddrPort(), client.LocalAddr().(*net.TCPAddr).AddrPort())
		if _, err := upstream.Write(hdr); err != nil {
			return
		}
	}
	idle := &idleWatch{timeout: set.cfg.IdleTimeout.Duration}
	done := make(chan struct{})
	go func() {
		defer close(done)
		n := proxyCopy(upstream, client, idle)
		b.m.toBackend.Add(float64(n))
	}()
	n := proxyCopy(client, upstream, idle)
	b.m.toClient.Add(float64(n))
	<-done
}

// idleWatch ends a connection once both directions have been idle for a
// whole timeout window.
type idleWatch struct {
	timeout time.Duration
	idle    atomic.Int32 // directions idle in their last window
}

// smallRead is the buffer of the first reads of a direction. A read that
// fills it marks the direction as bulk, which then moves to splice.
const smallRead = 16 << 10

var smallBufs = sync.Pool{New: func() any { b := make([]byte, smallRead); return &b }}

// proxyCopy copies src to dst until src ends, then half-closes dst so the
// far end sees the end of the stream (and may still answer). Like HAProxy's
// splice-auto, small messages go through read and write, and once a read
// fills the buffer the rest moves by the kernel's splice path (io.Copy
// between two *net.TCPConn). It returns the number of bytes copied. On an
// error or idle timeout both connections are closed, which also ends the
// copy in the other direction.
func proxyCopy(dst, src net.Conn, idle *idleWatch) int64 {
	var total int64
	idleHere := false
	bulk := false
	bufp := smallBufs.Get().(*[]byte)
	defer smallBufs.Put(bufp)
	buf := *bufp
	for {
		_ = src.SetReadDeadline(time.Now().Add(idle.timeout))
		var n int64
		var err error
		if bulk {
			// A LimitedReader around a *net.TCPConn still splices; the
			// limit lets the deadline be renewed on a busy connection.
			n, err = io.Copy(dst, &io.LimitedReader{R: src, N: copyChunk})
			if err == nil && n < copyChunk {
				err = io.EOF
			}
		} else {
			var m int
			m, err = src.Read(buf)
			if m > 0 {
				if _, werr := dst.Write(buf[:m]); werr != nil {
					err = werr
				}
				bulk = m == len(buf)
			}
			n = int64(m)
		}
		total += n
		if n > 0 && idleHere {
			idleHere = false
			idle.idle.Add(-1)
		}
		switch {
		case err == nil:
			continue
		case errors.Is(err, io.EOF):
			// End of stream from src: pass the half-close on. This
			// direction is idle from now on.
			if !idleHere {
				idle.idle.Add(1)
			}
			if tcp, ok := dst.(interface{ CloseWrite() error }); ok {
				_ = tcp.CloseWrite()
			} else {
				_ = dst.Close()
			}
			return total
		case errors.Is(err, os.ErrDeadlineExceeded):
			if n > 0 {
				continue // traffic in this window
			}
			if !idleHere {
				idleHere = true
				if idle.idle.Add(1) < 2 {
					continue // the other direction may still be busy
				}
			} else if idle.idle.Load() < 2 {
				continue
			}
		}
		_ = src.Close()
		_ = dst.Close()
		return total
	}
}
