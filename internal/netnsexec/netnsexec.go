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
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("opening this thread's network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(netns.NsHandle(fd)); err != nil {
			errc <- fmt.Errorf("entering network namespace %d: %w", fd, err)
			return
		}
		err = fn()
		if rerr := netns.Set(orig); rerr != nil {
			// The thread stays locked and ends with the goroutine: the
			// runtime retires it rather than reuse it in the wrong
			// namespace.
			errc <- errors.Join(err, rerr)
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}
