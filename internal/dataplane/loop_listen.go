package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// loopListener is a TCP frontend's listening socket on the event loop: a
// raw, non-blocking descriptor, which Go's own poller never watches (it
// would wake a thread for every new connection that nobody there waits
// for).
type loopListener struct {
	fd   int
	addr netip.AddrPort
	f    *frontend // set when the frontend starts serving

	// Only the loop's goroutine reads or writes these once it serves.
	serving, closed bool
	backoff         time.Duration
}

// listenBacklog asks for the longest accept queue; the kernel caps it at
// net.core.somaxconn.
const listenBacklog = 65535

// listenLoop opens a TCP frontend's listening socket for the event loop,
// with free-bind (see listen) and TCP_NODELAY, which the accepted sockets
// inherit (so that the proxy forwards each write at once without a system
// call per connection).
func listenLoop(k frontendKey) (*loopListener, error) {
	family := socketFamily(k.addr)
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening a socket: %w", err)
	}
	if err := setListenOptions(fd, family); err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	if err := sysBind(fd, k.addr); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("bind: %w", err)
	}
	if err := unix.Listen(fd, listenBacklog); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("listen: %w", err)
	}
	return newLoopListener(fd)
}

// sockOpt is one integer socket option set to 1.
type sockOpt struct {
	level, name int
	what        string
}

func setListenOptions(fd, family int) error {
	opts := []sockOpt{{unix.SOL_SOCKET, unix.SO_REUSEADDR, "SO_REUSEADDR"}, {unix.SOL_TCP, unix.TCP_NODELAY, "TCP_NODELAY"}}
	if family == unix.AF_INET {
		opts = append(opts, sockOpt{unix.SOL_IP, unix.IP_FREEBIND, "free-bind"})
	} else {
		opts = append(opts, sockOpt{unix.SOL_IPV6, unix.IPV6_FREEBIND, "free-bind"}, sockOpt{unix.SOL_IPV6, unix.IPV6_V6ONLY, "IPV6_V6ONLY"})
	}
	for _, o := range opts {
		if err := unix.SetsockoptInt(fd, o.level, o.name, 1); err != nil {
			return fmt.Errorf("setting %s: %w", o.what, err)
		}
	}
	return nil
}

// inheritLoopListener takes a listening socket a predecessor handed over
// for the event loop: a duplicate of its descriptor, non-blocking and
// with TCP_NODELAY (see listenLoop); file is left to the caller.
func inheritLoopListener(file *os.File) (*loopListener, error) {
	raw, err := file.SyscallConn()
	if err != nil {
		return nil, err
	}
	var fd int
	var derr error
	if err := raw.Control(func(old uintptr) {
		fd, derr = unix.FcntlInt(old, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, fmt.Errorf("duplicating the socket: %w", derr)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("making the socket non-blocking: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_TCP, unix.TCP_NODELAY, 1); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("setting TCP_NODELAY: %w", err)
	}
	return newLoopListener(fd)
}

func newLoopListener(fd int) (*loopListener, error) {
	at, err := sysGetsockname(fd)
	if err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("reading the socket's address: %w", err)
	}
	return &loopListener{fd: fd, addr: at}, nil
}

// file returns a duplicate of the listening socket, for a successor.
func (ln *loopListener) file() (*os.File, error) {
	fd, err := unix.FcntlInt(uintptr(ln.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("duplicating the socket: %w", err)
	}
	return os.NewFile(uintptr(fd), "tcp:"+ln.addr.String()), nil
}

// serve starts accepting on the loop.
func (ln *loopListener) serve(l *eventLoop, f *frontend) {
	l.do(func() {
		if ln.closed {
			return
		}
		ln.f = f
		if err := l.add(ln.fd, unix.EPOLLIN|unix.EPOLLET, ln); err != nil {
			l.d.log.Error(err, "Serving a frontend", "frontend", f.key.String())
			return
		}
		ln.serving = true
	})
}

// close stops accepting and closes the socket; it returns once the loop
// no longer uses it.
func (ln *loopListener) close(l *eventLoop) {
	if !l.call(func() { ln.closeOnLoop(l) }) {
		// The loop has stopped, and closed every listener it served; one
		// it never served is closed here.
		if !ln.serving && !ln.closed {
			ln.closed = true
			_ = unix.Close(ln.fd)
		}
	}
}

func (ln *loopListener) closeOnLoop(l *eventLoop) {
	if ln.closed {
		return
	}
	ln.closed = true
	if ln.serving {
		l.closeFD(ln.fd)
	} else {
		_ = unix.Close(ln.fd)
	}
}

func (ln *loopListener) event(l *eventLoop, _ uint32) { l.accept(ln) }

// accept takes the listener's queued connections, up to maxAcceptBatch
// (then it is in the backlog, for the next round).
func (l *eventLoop) accept(ln *loopListener) {
	for range maxAcceptBatch {
		if ln.closed {
			return
		}
		fd, from, err := sysAccept4(ln.fd)
		switch {
		case err == nil:
			ln.backoff = 0
			l.newConn(ln.f, fd, from)
			continue
		case errors.Is(err, unix.EAGAIN):
			return
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.ECONNABORTED):
			continue
		}
		// Out of file descriptors and the like: try again after a
		// while, as net/http does (no new edge may come meanwhile).
		ln.backoff = min(max(2*ln.backoff, 5*time.Millisecond), time.Second)
		l.d.log.Error(err, "Accepting a connection", "frontend", ln.f.key.String(), "retryIn", ln.backoff)
		l.d.clock.AfterFunc(ln.backoff, func() { l.do(func() { l.accept(ln) }) })
		return
	}
	l.backlog = append(l.backlog, ln)
}

// acceptBacklog accepts again from the listeners that stopped at
// maxAcceptBatch.
func (l *eventLoop) acceptBacklog() {
	if len(l.backlog) == 0 {
		return
	}
	lns := l.backlog
	l.backlog = nil
	for _, ln := range lns {
		l.accept(ln)
	}
}

// zoneIndex is the interface index of an IPv6 zone (0 for none or an
// unknown one).
func zoneIndex(zone string) uint32 {
	if zone == "" {
		return 0
	}
	ifi, err := net.InterfaceByName(zone)
	if err != nil {
		return 0
	}
	return uint32(ifi.Index)
}
