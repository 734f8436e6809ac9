// Package netnsexec runs a function in a network namespace.
package netnsexec

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// Run runs fn on a thread in the network namespace fd (0: the calling
// thread's own), as sockets, links and BPF attachments fn makes must be: a
// goroutine may run on any thread, and a caller such as a test may run on
// a thread in another namespace than the process's.
func Run(fd int, fn func() error) error {
	if fd == 0 {
		return fn()
	}
	return InThread(func() error {
		if err := netns.Set(netns.NsHandle(fd)); err != nil {
			return fmt.Errorf("entering network namespace %d: %w", fd, err)
		}
		return fn()
	})
}

// InThread runs fn on a goroutine locked to its thread, then puts the
// thread back in the network namespace it was in and unlocks it, so fn
// may switch the thread's namespace. Threads must not end: a child
// process's parent-death signal (Pdeathsig) follows the thread that
// forked it, and any goroutine may have forked on any thread. Only if the
// namespace cannot be restored does the goroutine end locked, so that the
// runtime retires a thread in the wrong namespace.
func InThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("opening this thread's network namespace: %w", err)
			return
		}
		defer orig.Close()
		err = fn()
		if rerr := netns.Set(orig); rerr != nil {
			errc <- errors.Join(err, fmt.Errorf("returning to the thread's network namespace: %w", rerr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}
