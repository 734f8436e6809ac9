// Package network builds the local cluster's network out of Linux network
// namespaces: one namespace per simulated machine (a Host), the node network
// as a bridge that the hosts join through veth pairs (one L2 segment with
// real ARP and NDP), and point-to-point links (a router and a client on
// another subnet). Code reaches into a host with Do: sockets opened and
// processes started there belong to that host's network, whatever thread
// later uses them.
//
// Everything here changes the network of the namespace the caller runs in,
// so it is only ever used inside the private namespace made by
// localcluster.Reexec.
package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Host is one simulated machine: a network namespace with its interfaces,
// addresses and routes.
type Host struct {
	// Name names the host in messages (a node's name, "router", "client").
	Name string

	ns netns.NsHandle
	nl *netlink.Handle
	// root is true for the namespace the Network was made in, which this
	// process itself runs in: Do needs no namespace switch there.
	root bool

	// starter is a thread that stays in the namespace for as long as the
	// host exists and forks its processes (see Start).
	starterOnce sync.Once
	starter     chan func()
	starterErr  error
}

// newHost makes a new network namespace with its loopback up.
func newHost(name string) (*Host, error) {
	var ns netns.NsHandle
	// netns.New switches the calling thread into the new namespace; do it
	// on a thread that dies with its goroutine, so no other goroutine ever
	// runs in the wrong namespace.
	err := onNewThread(func() error {
		var err error
		ns, err = netns.New()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("creating the network namespace of %s: %w", name, err)
	}
	h, err := hostAt(name, ns, false)
	if err != nil {
		_ = ns.Close()
		return nil, err
	}
	lo, err := h.nl.LinkByName("lo")
	if err == nil {
		err = h.nl.LinkSetUp(lo)
	}
	if err != nil {
		h.close()
		return nil, fmt.Errorf("bringing up loopback of %s: %w", name, err)
	}
	return h, nil
}

// currentHost wraps the namespace this process runs in.
func currentHost(name string) (*Host, error) {
	ns, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("opening this process's network namespace: %w", err)
	}
	return hostAt(name, ns, true)
}

func hostAt(name string, ns netns.NsHandle, root bool) (*Host, error) {
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("opening netlink in the namespace of %s: %w", name, err)
	}
	return &Host{Name: name, ns: ns, nl: nl, root: root}, nil
}

func (h *Host) close() {
	if h.starter != nil {
		close(h.starter)
	}
	h.nl.Close()
	_ = h.ns.Close()
}

// onNewThread runs fn on a goroutine locked to a thread of its own that is
// never unlocked: when the goroutine ends the runtime retires the thread, so
// whatever fn did to the thread's namespaces cannot leak to other goroutines.
func onNewThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- fn()
	}()
	return <-errc
}

// Do runs fn inside the host's network namespace. Sockets fn opens and
// processes it starts belong to the host; goroutines fn starts do not.
func (h *Host) Do(fn func() error) error {
	if h.root {
		return fn()
	}
	return onNewThread(func() error {
		if err := netns.Set(h.ns); err != nil {
			return fmt.Errorf("entering the network namespace of %s: %w", h.Name, err)
		}
		return fn()
	})
}

// Listen opens a stream listener on the host, as net.Listen does.
func (h *Host) Listen(network, address string) (net.Listener, error) {
	var ln net.Listener
	err := h.Do(func() (err error) {
		ln, err = net.Listen(network, address)
		return err
	})
	return ln, err
}

// ListenPacket opens a packet listener on the host, as net.ListenPacket does.
func (h *Host) ListenPacket(network, address string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := h.Do(func() (err error) {
		pc, err = net.ListenPacket(network, address)
		return err
	})
	return pc, err
}

// DialContext connects from the host, as net.Dialer.DialContext does.
func (h *Host) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var c net.Conn
	err := h.Do(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// Start starts cmd inside the host's network namespace: it inherits the
// namespaces of the thread that forks it. That thread lives as long as the
// host, because a child's parent-death signal (Pdeathsig) follows the
// forking thread, not the process: a thread that ended after the fork would
// kill the child at once.
func (h *Host) Start(cmd *exec.Cmd) error {
	if h.root {
		return cmd.Start()
	}
	h.starterOnce.Do(func() {
		ready := make(chan error, 1)
		work := make(chan func())
		go func() {
			runtime.LockOSThread()
			if err := netns.Set(h.ns); err != nil {
				ready <- fmt.Errorf("entering the network namespace of %s: %w", h.Name, err)
				return
			}
			ready <- nil
			for fn := range work {
				fn()
			}
		}()
		if h.starterErr = <-ready; h.starterErr == nil {
			h.starter = work
		}
	})
	if h.starterErr != nil {
		return h.starterErr
	}
	errc := make(chan error, 1)
	h.starter <- func() { errc <- cmd.Start() }
	return <-errc
}

// SetSysctl writes a sysctl of the host's network namespace, e.g.
// "net/ipv4/ip_forward": /proc/sys/net is the network of whoever opens it.
func (h *Host) SetSysctl(name, value string) error {
	return h.Do(func() error {
		if err := os.WriteFile(filepath.Join("/proc/sys", name), []byte(value), 0o644); err != nil {
			return fmt.Errorf("setting %s on %s: %w", name, h.Name, err)
		}
		return nil
	})
}

// AddAddress puts p on the host's interface dev ("lo", "eth0", ...). A
// prefix on lo makes every address in it local to the host.
func (h *Host) AddAddress(dev string, p netip.Prefix) error {
	link, err := h.nl.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("finding %s on %s: %w", dev, h.Name, err)
	}
	addr := &netlink.Addr{IPNet: ipNet(p)}
	if p.Addr().Is6() {
		// No duplicate address detection: the addresses are planned, and DAD
		// would hold a new address unusable for a second or more.
		addr.Flags = nodad
	}
	if err := h.nl.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("adding %s to %s on %s: %w", p, dev, h.Name, err)
	}
	return nil
}

// nodad is IFA_F_NODAD.
const nodad = 0x02

// AddRoute routes dst through the gateways (several make an ECMP route).
func (h *Host) AddRoute(dst netip.Prefix, via ...netip.Addr) error {
	r := &netlink.Route{Dst: ipNet(dst)}
	switch len(via) {
	case 0:
		return fmt.Errorf("route to %s on %s: no gateway", dst, h.Name)
	case 1:
		r.Gw = via[0].AsSlice()
	default:
		for _, gw := range via {
			r.MultiPath = append(r.MultiPath, &netlink.NexthopInfo{Gw: gw.AsSlice()})
		}
	}
	if err := h.nl.RouteReplace(r); err != nil {
		return fmt.Errorf("routing %s via %v on %s: %w", dst, via, h.Name, err)
	}
	return nil
}

// DeleteRoute removes the route to dst, if there is one.
func (h *Host) DeleteRoute(dst netip.Prefix) error {
	if err := h.nl.RouteDel(&netlink.Route{Dst: ipNet(dst)}); err != nil && !isNotFound(err) {
		return fmt.Errorf("removing the route to %s on %s: %w", dst, h.Name, err)
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), bits)}
}
