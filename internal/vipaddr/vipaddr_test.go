package vipaddr

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inNewNamespace runs fn on a thread inside a new network namespace with
// its loopback up. The thread never returns to the pool: it ends with fn.
func inNewNamespace(t *testing.T, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		ns, err := netns.New()
		if err != nil {
			t.Errorf("creating a network namespace (the tests run as root): %v", err)
			return
		}
		defer ns.Close()
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			t.Errorf("bringing loopback up: %v", err)
			return
		}
		fn()
	}()
	<-done
}

// Sync adds a local route per address, so a socket on it gets traffic,
// removes the routes no longer wanted, and leaves addresses the host
// already owns alone.
func TestSyncMakesAddressesLocalAndRemovesThemAgain(t *testing.T) {
	inNewNamespace(t, func() {
		tbl, err := New()
		if err != nil {
			t.Error(err)
			return
		}
		defer tbl.Close()
		v4, v6, loop := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("127.0.0.1")
		if err := tbl.Sync([]netip.Addr{v4, v6, loop}); err != nil {
			t.Error(err)
			return
		}
		got, err := tbl.Addresses()
		if err != nil {
			t.Error(err)
			return
		}
		if want := []netip.Addr{v4, v6}; !slices.Equal(got, want) {
			t.Errorf("ebb's local routes cover %v, want %v (127.0.0.1 is the host's own)", got, want)
		}
		for _, a := range []netip.Addr{v4, v6} {
			ln, err := freeBindListen(a)
			if err != nil {
				t.Errorf("listening on %s: %v", a, err)
				continue
			}
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Errorf("%s does not take traffic: %v", a, err)
			} else {
				_ = c.Close()
			}
			_ = ln.Close()
		}

		if err := tbl.Sync([]netip.Addr{v6}); err != nil {
			t.Error(err)
			return
		}
		if got, _ := tbl.Addresses(); !slices.Equal(got, []netip.Addr{v6}) {
			t.Errorf("after dropping %s: %v", v4, got)
		}
		if ln, err := freeBindListen(v4); err == nil {
			if c, err := net.DialTimeout("tcp", ln.Addr().String(), 200*time.Millisecond); err == nil {
				_ = c.Close()
				t.Errorf("%s still takes traffic after its route was removed", v4)
			}
			_ = ln.Close()
		}
		// A new Table (a restarted process) finds and removes what is left.
		again, err := New()
		if err != nil {
			t.Error(err)
			return
		}
		defer again.Close()
		if err := again.Sync(nil); err != nil {
			t.Error(err)
		}
		if got, _ := tbl.Addresses(); len(got) != 0 {
			t.Errorf("routes left after syncing nothing: %v", got)
		}
	})
}

// freeBindListen listens on a with free-bind, as the data plane does: IPv6
// never binds an address that no interface has, local route or not.
func freeBindListen(a netip.Addr) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if a.Is4() {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
			}
		})
		return errors.Join(err, serr)
	}}
	return lc.Listen(context.Background(), "tcp", netip.AddrPortFrom(a, 0).String())
}

// An announced aggregate gets a blackhole route, so that traffic to its
// addresses the host does not serve is dropped, while a served address
// stays local (the local table wins); routes no longer wanted go.
func TestSyncAggregatesDropsWhatIsNotServed(t *testing.T) {
	inNewNamespace(t, func() {
		tbl, err := New()
		if err != nil {
			t.Error(err)
			return
		}
		defer tbl.Close()
		served := netip.MustParseAddr("198.51.100.1")
		agg4, agg6 := netip.MustParsePrefix("198.51.100.0/28"), netip.MustParsePrefix("2001:db8::/124")
		if err := tbl.Sync([]netip.Addr{served}); err != nil {
			t.Error(err)
			return
		}
		if err := tbl.SyncAggregates([]netip.Prefix{agg4, agg6}); err != nil {
			t.Error(err)
			return
		}
		kind := func(a string) int {
			routes, err := netlink.RouteGet(net.ParseIP(a))
			if err != nil {
				// The kernel answers a blackhole's lookup with EINVAL.
				if errors.Is(err, unix.EINVAL) {
					return unix.RTN_BLACKHOLE
				}
				t.Errorf("route of %s: %v", a, err)
				return -1
			}
			return routes[0].Type
		}
		if k := kind("198.51.100.1"); k != unix.RTN_LOCAL {
			t.Errorf("the served address's route is of type %d, want local", k)
		}
		if k := kind("198.51.100.9"); k != unix.RTN_BLACKHOLE {
			t.Errorf("an unserved address of the aggregate routes as type %d, want blackhole", k)
		}
		have, err := tbl.listBlackholes()
		if err != nil || len(have) != 2 || !have[agg4] || !have[agg6] {
			t.Errorf("blackhole routes %v (%v), want %s and %s", have, err, agg4, agg6)
		}
		if err := tbl.SyncAggregates(nil); err != nil {
			t.Error(err)
			return
		}
		if have, err := tbl.listBlackholes(); err != nil || len(have) != 0 {
			t.Errorf("blackhole routes left: %v (%v)", have, err)
		}
	})
}
