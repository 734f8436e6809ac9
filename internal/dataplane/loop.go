package dataplane

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The proxy engine moves its TCP connections on one event loop: a
// goroutine that waits in epoll_wait (edge-triggered) over raw,
// non-blocking sockets and does each connection's reads and writes itself,
// as HAProxy does. Go's net package costs a proxied connection about a
// third more system calls than that (it asks the kernel for both addresses
// of every socket, reads each direction until EAGAIN, asks for SO_ERROR
// after a connect and removes each socket from its poller before closing
// it), and two goroutines per connection add the scheduler's wake-ups
// between them.
//
// Only the loop's goroutine touches its sockets and connections. Other
// goroutines (the idle sweeper, drain timers, Apply, Close) ask it to act
// with do or call, which wake it through an eventfd.

// loopEvents is the most events one epoll_wait returns.
const loopEvents = 256

// loopReadSize is the loop's one read buffer: every read lands in it and
// is written on at once; only what the far side cannot take yet is copied
// into the connection's own buffer.
const loopReadSize = 64 << 10

// maxAcceptBatch bounds the connections one listener accepts before the
// loop serves the others' events (HAProxy's tune.maxaccept).
const maxAcceptBatch = 64

// connectCheckInterval is how often, at most, the loop looks for connects
// past their timeout while any is in flight.
const connectCheckInterval = 10 * time.Millisecond

// briefWait is how long the loop, out of events, waits for more in the
// kernel before it parks on Go's poller (see run).
const briefWait = 200 * time.Microsecond

// yieldInterval is how often a loop that never runs out of events lets
// the scheduler run (see yield).
const yieldInterval = time.Millisecond

// loopHandler is what owns one of the loop's file descriptors.
type loopHandler interface {
	// event handles epoll's events for the descriptor.
	event(l *eventLoop, events uint32)
}

// loopFD is an entry of the loop's descriptor table. gen tells a stale
// event (for a descriptor closed, and its number reused, in the same
// batch) from a current one: epoll returns it with the event.
type loopFD struct {
	h   loopHandler
	gen uint32
}

// eventLoop runs the proxy engine's TCP connections (see above).
type eventLoop struct {
	d      *DataPlane
	epfd   int
	wakefd int // eventfd: commands are waiting
	netns  int // a network namespace the loop's thread joins (tests); 0: none

	mu      sync.Mutex
	cmds    []func()
	stopped bool
	exited  chan struct{}

	// Only the loop's goroutine reads or writes what follows.
	fds        []loopFD
	gen        uint32
	buf        []byte
	connecting []*loopConn
	nextCheck  time.Time
	// epf is the epoll descriptor as Go's poller watches it, raw its
	// descriptor, deadline its read deadline.
	epf      *os.File
	raw      syscall.RawConn
	deadline time.Time
	// events holds the events of the last wait, the first ready of them.
	// poll is pollReady, made into a function once.
	events []unix.EpollEvent
	ready  int
	poll   func(uintptr) bool
	// briefWait: wait up to briefWait in the kernel before parking (see
	// run); off where epoll_pwait2 is missing.
	briefWait bool
	// backlog are listeners that stopped at maxAcceptBatch with
	// connections still queued: their edge has passed, so the loop
	// accepts from them again without waiting for a new one.
	backlog []*loopListener
	quit    bool
}

// newEventLoop starts a loop for d.
func newEventLoop(d *DataPlane, netns int) (*eventLoop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating the proxy's epoll instance: %w", err)
	}
	wakefd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("creating the proxy's eventfd: %w", err)
	}
	l := &eventLoop{d: d, epfd: epfd, wakefd: wakefd, netns: netns, exited: make(chan struct{}), buf: make([]byte, loopReadSize), briefWait: true}
	if err := l.add(wakefd, unix.EPOLLIN|unix.EPOLLET, wakeHandler{}); err != nil {
		_ = unix.Close(epfd)
		_ = unix.Close(wakefd)
		return nil, err
	}
	started := make(chan error, 1)
	go l.run(started)
	if err := <-started; err != nil {
		if l.epf != nil {
			_ = l.epf.Close() // it owns epfd
		} else {
			_ = unix.Close(epfd)
		}
		_ = unix.Close(wakefd)
		return nil, err
	}
	return l, nil
}

// wakeHandler owns the eventfd: its event means commands are waiting.
type wakeHandler struct{}

func (wakeHandler) event(l *eventLoop, _ uint32) {
	var b [8]byte
	_, _ = sysRead(l.wakefd, b[:])
	l.mu.Lock()
	cmds := l.cmds
	l.cmds = nil
	l.mu.Unlock()
	for _, fn := range cmds {
		fn()
	}
}

// do runs fn on the loop's goroutine, soon; nothing if the loop stopped.
func (l *eventLoop) do(fn func()) bool {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return false
	}
	l.cmds = append(l.cmds, fn)
	first := len(l.cmds) == 1
	l.mu.Unlock()
	if first {
		one := [8]byte{1}
		_, _ = unix.Write(l.wakefd, one[:])
	}
	return true
}

// call runs fn on the loop's goroutine and returns when it has run; false
// (and fn never runs) if the loop stopped.
func (l *eventLoop) call(fn func()) bool {
	done := make(chan struct{})
	if !l.do(func() { fn(); close(done) }) {
		return false
	}
	select {
	case <-done:
		return true
	case <-l.exited:
		return false
	}
}

// stop closes every socket of the loop (listeners and connections) and
// ends it; it returns once the loop is gone.
func (l *eventLoop) stop() {
	l.call(func() { l.quit = true })
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	<-l.exited
}

func (l *eventLoop) run(started chan<- error) {
	if l.netns != 0 {
		// The thread stays in the namespace and dies with the goroutine
		// (it is never unlocked).
		runtime.LockOSThread()
		if err := unix.Setns(l.netns, unix.CLONE_NEWNET); err != nil {
			started <- fmt.Errorf("joining the proxy's network namespace: %w", err)
			return
		}
	}
	// The loop never blocks in epoll_wait itself: a goroutine blocked in
	// a system call holds its thread's processor until the runtime's
	// monitor takes it away, and the monitor then wakes every 20 µs to
	// do so again. Instead the epoll descriptor is itself watched by Go's
	// poller (it is readable while events wait), and the loop parks like
	// any goroutine reading a socket. Parking and waking that way cost
	// several system calls and a pass of the scheduler (9% of the loop's
	// CPU under load), so the loop first waits briefly in the kernel
	// itself (briefWait, unseen by the runtime like its other system
	// calls): under load the next event comes within it. Meanwhile no
	// other goroutine runs on the loop's processor; with one processor,
	// timers and probes run up to briefWait late, or up to yieldInterval
	// while the loop is busy (see yield).
	if err := unix.SetNonblock(l.epfd, true); err != nil {
		started <- fmt.Errorf("making the proxy's epoll instance non-blocking: %w", err)
		return
	}
	l.epf = os.NewFile(uintptr(l.epfd), "ebb-proxy-epoll")
	var err error
	if l.raw, err = l.epf.SyscallConn(); err != nil {
		started <- fmt.Errorf("watching the proxy's epoll instance: %w", err)
		return
	}
	started <- nil
	defer close(l.exited)
	l.events = make([]unix.EpollEvent, loopEvents)
	l.poll = l.pollReady
	lastYield := time.Now()
	for !l.quit {
		if now := time.Now(); now.Sub(lastYield) > yieldInterval {
			l.yield()
			lastYield = now
		}
		l.wait()
		for i := range l.ready {
			ev := &l.events[i]
			fd := int(ev.Fd)
			if fd < len(l.fds) && l.fds[fd].h != nil && l.fds[fd].gen == uint32(ev.Pad) {
				l.fds[fd].h.event(l, ev.Events)
			}
		}
		l.acceptBacklog()
		l.checkConnects()
	}
	l.closeEverything()
}

// pollReady takes the events waiting into l.events, without blocking, and
// says whether the loop has work. Go's poller calls it when the epoll
// descriptor is readable.
func (l *eventLoop) pollReady(fd uintptr) bool {
	n, err := sysEpollWait(int(fd), l.events)
	l.ready = max(n, 0)
	return n > 0 || len(l.backlog) > 0 || (err != nil && !errors.Is(err, unix.EINTR))
}

// wait puts in l.events the events waiting, else those that come within
// briefWait, else it parks on Go's poller until some come or the next
// connect check is due.
func (l *eventLoop) wait() {
	if l.poll(uintptr(l.epfd)) {
		return
	}
	if l.briefWait {
		// Let the goroutines that are ready run first: while the loop
		// waits in the kernel, none can run on its processor.
		runtime.Gosched()
		m, err := sysEpollWaitFor(l.epfd, l.events, briefWait)
		switch {
		case errors.Is(err, unix.ENOSYS):
			l.briefWait = false // before Linux 5.11
		case m > 0:
			l.ready = m
			return
		}
	}
	l.setDeadline()
	if err := l.raw.Read(l.poll); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		l.d.log.Error(err, "Waiting for the proxy's events")
		time.Sleep(10 * time.Millisecond)
	}
}

// yield lets the rest of the process run while the loop never runs out of
// events. runtime.Gosched alone runs the goroutines that are ready, but
// not those whose sockets are: the scheduler asks Go's poller only when no
// goroutine is runnable, and a loop that yields stays runnable, so the
// metrics server, the API watches and the probes would wait for the
// runtime's monitor to poll (every 10 ms). So the loop parks once on its
// epoll descriptor, after a wake-up of its own (the eventfd) that makes the
// descriptor readable: the scheduler runs the ready goroutines, polls, and
// finds the loop ready again with the others. A goroutine that runs for
// 10 ms without a break would also be preempted by the monitor, which then
// polls every 20 µs for a while.
func (l *eventLoop) yield() {
	l.setDeadline() // a past one would end the park before it began
	parked := false
	_ = l.raw.Read(func(uintptr) bool {
		if parked {
			return true
		}
		parked = true
		// Woken here, not before Read: Read first forgets a readiness
		// the poller may already have seen.
		one := [8]byte{1}
		_, _ = sysWrite(l.wakefd, one[:])
		return false
	})
}

// setDeadline bounds the wait for events by the next connect check while
// connects are in flight.
func (l *eventLoop) setDeadline() {
	var want time.Time
	if len(l.connecting) > 0 {
		want = l.nextCheck
	}
	if !want.Equal(l.deadline) {
		l.deadline = want
		_ = l.epf.SetReadDeadline(want)
	}
}

// add registers fd with the loop.
func (l *eventLoop) add(fd int, events uint32, h loopHandler) error {
	l.gen++
	ev := unix.EpollEvent{Events: events, Fd: int32(fd), Pad: int32(l.gen)}
	if err := sysEpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("adding a socket to the proxy's epoll instance: %w", err)
	}
	for fd >= len(l.fds) {
		l.fds = append(l.fds, make([]loopFD, len(l.fds)+64)...)
	}
	l.fds[fd] = loopFD{h: h, gen: l.gen}
	return nil
}

// closeFD closes a descriptor of the loop (which also takes it out of the
// epoll instance: the loop never duplicates its descriptors).
func (l *eventLoop) closeFD(fd int) {
	if fd < len(l.fds) {
		l.fds[fd] = loopFD{}
	}
	_ = sysClose(fd)
}

// closeEverything closes every listener and connection left (the loop is
// stopping).
func (l *eventLoop) closeEverything() {
	for fd, e := range l.fds {
		switch h := e.h.(type) {
		case *loopListener:
			h.closeOnLoop(l)
		case *loopSide:
			l.closeConn(h.conn)
		case nil:
		default:
			l.closeFD(fd)
		}
	}
	_ = l.epf.Close()
}
