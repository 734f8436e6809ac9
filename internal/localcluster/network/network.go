package network

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
)

// BridgeName is the node network's bridge, in the namespace that made the
// Network.
const BridgeName = "ebb-nodes"

// Network is a set of hosts: the namespace it was made in (Root), which
// owns the node network's bridge, and the hosts added to it.
type Network struct {
	// Root is the namespace this process runs in. It joins the bridge with
	// the bridge device itself.
	Root *Host

	bridge netlink.Link

	mu    sync.Mutex
	hosts map[string]*Host
	// ports are the bridge-side ends of the hosts' veth pairs, by host.
	ports map[string]netlink.Link
	next  int
}

// New makes the node network's bridge in the current namespace, gives Root
// the addresses on it and brings it up.
func New(rootName string, rootAddrs ...netip.Prefix) (*Network, error) {
	root, err := currentHost(rootName)
	if err != nil {
		return nil, err
	}
	n := &Network{Root: root, hosts: map[string]*Host{rootName: root}, ports: map[string]netlink.Link{}}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: BridgeName}}
	if err := root.nl.LinkAdd(br); err != nil {
		root.close()
		return nil, fmt.Errorf("creating the bridge %s: %w", BridgeName, err)
	}
	n.bridge = br
	if err := root.nl.LinkSetUp(br); err != nil {
		n.Close()
		return nil, fmt.Errorf("bringing up the bridge %s: %w", BridgeName, err)
	}
	for _, a := range rootAddrs {
		if err := root.AddAddress(BridgeName, a); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

// Host returns the named host.
func (n *Network) Host(name string) (*Host, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h, ok := n.hosts[name]
	return h, ok
}

// AddHost makes a new host whose eth0 joins the bridge with addrs, and turns
// on forwarding (every host may route: nodes forward to their pods, the
// router between subnets).
func (n *Network) AddHost(name string, addrs ...netip.Prefix) (*Host, error) {
	h, err := n.newHost(name)
	if err != nil {
		return nil, err
	}
	port, err := n.plug(h, "eth0", addrs)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.ports[name] = port
	n.mu.Unlock()
	return h, nil
}

// AddIsolatedHost makes a new host with no interface but loopback; Link
// connects it to others.
func (n *Network) AddIsolatedHost(name string) (*Host, error) {
	return n.newHost(name)
}

func (n *Network) newHost(name string) (*Host, error) {
	n.mu.Lock()
	_, exists := n.hosts[name]
	n.mu.Unlock()
	if exists {
		return nil, fmt.Errorf("host %s exists already", name)
	}
	h, err := newHost(name)
	if err != nil {
		return nil, err
	}
	for _, s := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
		if err := h.SetSysctl(s, "1"); err != nil {
			h.close()
			return nil, err
		}
	}
	n.mu.Lock()
	n.hosts[name] = h
	n.mu.Unlock()
	return h, nil
}

// plug connects h to the bridge through a veth pair: the host's end is
// named dev and gets addrs; the bridge's end is returned.
func (n *Network) plug(h *Host, dev string, addrs []netip.Prefix) (netlink.Link, error) {
	outer, err := n.vethInto(h, dev, addrs)
	if err != nil {
		return nil, err
	}
	if err := n.Root.nl.LinkSetMaster(outer, n.bridge); err != nil {
		return nil, fmt.Errorf("attaching %s's link to the bridge: %w", h.Name, err)
	}
	if err := n.Root.nl.LinkSetUp(outer); err != nil {
		return nil, fmt.Errorf("bringing up %s's link on the bridge: %w", h.Name, err)
	}
	return outer, nil
}

// vethInto makes a veth pair in the root namespace, moves one end into h
// as dev with addrs and returns the other end (still in the root namespace,
// down).
func (n *Network) vethInto(h *Host, dev string, addrs []netip.Prefix) (netlink.Link, error) {
	n.mu.Lock()
	n.next++
	outerName, innerName := fmt.Sprintf("ebbv%d", n.next), fmt.Sprintf("ebbp%d", n.next)
	n.mu.Unlock()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: outerName}, PeerName: innerName}
	if err := n.Root.nl.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("creating a veth pair for %s: %w", h.Name, err)
	}
	inner, err := n.Root.nl.LinkByName(innerName)
	if err != nil {
		return nil, fmt.Errorf("finding %s: %w", innerName, err)
	}
	if err := n.Root.nl.LinkSetNsFd(inner, int(h.ns)); err != nil {
		return nil, fmt.Errorf("moving %s into %s: %w", innerName, h.Name, err)
	}
	if err := h.configure(innerName, dev, addrs); err != nil {
		return nil, err
	}
	outer, err := n.Root.nl.LinkByName(outerName)
	if err != nil {
		return nil, fmt.Errorf("finding %s: %w", outerName, err)
	}
	return outer, nil
}

// configure renames the interface name to dev, adds addrs and brings it up.
func (h *Host) configure(name, dev string, addrs []netip.Prefix) error {
	link, err := h.nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("finding %s in %s: %w", name, h.Name, err)
	}
	if err := h.nl.LinkSetName(link, dev); err != nil {
		return fmt.Errorf("renaming %s to %s in %s: %w", name, dev, h.Name, err)
	}
	if err := h.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("bringing up %s in %s: %w", dev, h.Name, err)
	}
	for _, a := range addrs {
		if err := h.AddAddress(dev, a); err != nil {
			return err
		}
	}
	return nil
}

// Link joins two hosts by a point-to-point veth pair: a's end is devA with
// addrsA, b's end devB with addrsB (a router and the client behind it).
func (n *Network) Link(a *Host, devA string, addrsA []netip.Prefix, b *Host, devB string, addrsB []netip.Prefix) error {
	outer, err := n.vethInto(a, devA, addrsA)
	if err != nil {
		return err
	}
	// The end still in the root namespace moves into b.
	tmp := outer.Attrs().Name
	if err := n.Root.nl.LinkSetNsFd(outer, int(b.ns)); err != nil {
		return fmt.Errorf("moving %s into %s: %w", tmp, b.Name, err)
	}
	return b.configure(tmp, devB, addrsB)
}

// Disconnect cuts a host off the bridge, as if its machine vanished: its
// packets go nowhere and nothing reaches it; nothing inside it is told.
func (n *Network) Disconnect(name string) error { return n.setPlugged(name, false) }

// Reconnect undoes Disconnect.
func (n *Network) Reconnect(name string) error { return n.setPlugged(name, true) }

// setPlugged brings the bridge-side end of a host's link up or down.
func (n *Network) setPlugged(name string, up bool) error {
	port, err := n.port(name)
	if err != nil {
		return err
	}
	set, what := n.Root.nl.LinkSetDown, "cutting %s off the bridge: %w"
	if up {
		set, what = n.Root.nl.LinkSetUp, "plugging %s back into the bridge: %w"
	}
	if err := set(port); err != nil {
		return fmt.Errorf(what, name, err)
	}
	return nil
}

func (n *Network) port(name string) (netlink.Link, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	port, ok := n.ports[name]
	if !ok {
		return nil, fmt.Errorf("no host %s on the bridge", name)
	}
	return port, nil
}

// Close deletes the links and the bridge and closes every namespace handle.
// A namespace itself goes away with the last process in it.
func (n *Network) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for name, port := range n.ports {
		_ = n.Root.nl.LinkDel(port)
		delete(n.ports, name)
	}
	if n.bridge != nil {
		_ = n.Root.nl.LinkDel(n.bridge)
		n.bridge = nil
	}
	for name, h := range n.hosts {
		h.close()
		delete(n.hosts, name)
	}
}

func isNotFound(err error) bool {
	return errors.Is(err, syscall.ESRCH) || errors.Is(err, syscall.ENOENT)
}
