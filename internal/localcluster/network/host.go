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

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/ebbdev/ebb/internal/netnsexec"
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
}

// newHost makes a new network namespace with its loopback up.
func newHost(name string) (*Host, error) {
	var ns netns.NsHandle
	// netns.New switches the calling thread into the new namespace;
	// InThread switches it back.
	err := netnsexec.InThread(func() error {
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

// NewHost makes a standalone host: a new network namespace with loopback
// up, on no network (LinkHosts joins it to others). Close removes it.
func NewHost(name string) (*Host, error) { return newHost(name) }

// OpenHost wraps the existing network namespace at path (e.g.
// /proc/<pid>/ns/net of a process in it), made by something else: a real
// node's CNI plugin for a pod. Close releases the handle; the namespace
// stays as long as its maker keeps it.
func OpenHost(name, path string) (*Host, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("opening the network namespace of %s (%s): %w", name, path, err)
	}
	h, err := hostAt(name, ns, false)
	if err != nil {
		_ = ns.Close()
		return nil, err
	}
	return h, nil
}

// Close releases the host's namespace; it goes away once nothing (a
// socket, a process) is left in it.
func (h *Host) Close() { h.close() }

// NetNS is the file descriptor of the host's network namespace, for
// libraries that program a namespace from outside (nftables).
func (h *Host) NetNS() int { return int(h.ns) }

// LinkHosts joins two hosts by a veth pair, a's end devA with addrsA, b's
// devB with addrsB. The pair is made inside a, whose interface names are
// its own, so that nothing clashes with links of this process's namespace.
func LinkHosts(a *Host, devA string, addrsA []netip.Prefix, b *Host, devB string, addrsB []netip.Prefix) error {
	peer := "ebbpeer-" + devB
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: devA}, PeerName: peer}
	if err := a.nl.LinkAdd(veth); err != nil {
		return fmt.Errorf("creating a veth pair in %s: %w", a.Name, err)
	}
	inner, err := a.nl.LinkByName(peer)
	if err != nil {
		return fmt.Errorf("finding %s in %s: %w", peer, a.Name, err)
	}
	if err := a.nl.LinkSetNsFd(inner, int(b.ns)); err != nil {
		return fmt.Errorf("moving %s into %s: %w", peer, b.Name, err)
	}
	if err := a.configure(devA, devA, addrsA); err != nil {
		return err
	}
	return b.configure(peer, devB, addrsB)
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
	h.nl.Close()
	_ = h.ns.Close()
}

// Do runs fn inside the host's network namespace. Sockets fn opens and
// processes it starts belong to the host; goroutines fn starts do not.
func (h *Host) Do(fn func() error) error {
	if h.root {
		return fn()
	}
	return netnsexec.InThread(func() error {
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

// Start starts cmd inside the host's network namespace: the child inherits
// the namespace of the thread that forks it (inThread keeps that thread
// alive afterwards, as the child's parent-death signal needs).
func (h *Host) Start(cmd *exec.Cmd) error {
	return h.Do(cmd.Start)
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

// AddRouteFrom routes dst through via, with src as the preferred source
// address of the connections this host opens along it (a bind would also
// set it, but would keep the kernel from reusing ports in TIME_WAIT).
func (h *Host) AddRouteFrom(dst netip.Prefix, via, src netip.Addr) error {
	r := &netlink.Route{Dst: ipNet(dst), Gw: via.AsSlice(), Src: src.AsSlice()}
	if err := h.nl.RouteReplace(r); err != nil {
		return fmt.Errorf("routing %s via %s from %s on %s: %w", dst, via, src, h.Name, err)
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
