package network

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// AddBridge makes a bridge named name on the host and brings it up: a
// switch of its own, for tests that need one L2 segment between hosts
// that are not the cluster's.
func (h *Host) AddBridge(name string) error {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := h.nl.LinkAdd(br); err != nil {
		return fmt.Errorf("creating the bridge %s on %s: %w", name, h.Name, err)
	}
	if err := h.nl.LinkSetUp(br); err != nil {
		return fmt.Errorf("bringing up the bridge %s on %s: %w", name, h.Name, err)
	}
	return nil
}

// AttachToBridge makes the host's interface dev a port of its bridge.
func (h *Host) AttachToBridge(dev, bridge string) error {
	link, err := h.nl.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("finding %s on %s: %w", dev, h.Name, err)
	}
	br, err := h.nl.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("finding %s on %s: %w", bridge, h.Name, err)
	}
	if err := h.nl.LinkSetMaster(link, br); err != nil {
		return fmt.Errorf("attaching %s to %s on %s: %w", dev, bridge, h.Name, err)
	}
	return nil
}

// SetLinkUp brings the host's interface dev up or down.
func (h *Host) SetLinkUp(dev string, up bool) error {
	link, err := h.nl.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("finding %s on %s: %w", dev, h.Name, err)
	}
	set := h.nl.LinkSetDown
	if up {
		set = h.nl.LinkSetUp
	}
	if err := set(link); err != nil {
		return fmt.Errorf("setting %s up=%v on %s: %w", dev, up, h.Name, err)
	}
	return nil
}

// HardwareAddr returns the MAC address of the host's interface dev.
func (h *Host) HardwareAddr(dev string) (net.HardwareAddr, error) {
	link, err := h.nl.LinkByName(dev)
	if err != nil {
		return nil, fmt.Errorf("finding %s on %s: %w", dev, h.Name, err)
	}
	return link.Attrs().HardwareAddr, nil
}

// AddLinkRoute routes dst straight out of the host's interface dev (on
// link, no gateway): the host resolves each destination in dst by ARP or
// NDP on that segment, as a router does for a subnet announced at L2.
func (h *Host) AddLinkRoute(dst netip.Prefix, dev string) error {
	link, err := h.nl.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("finding %s on %s: %w", dev, h.Name, err)
	}
	r := &netlink.Route{Dst: ipNet(dst), LinkIndex: link.Attrs().Index, Scope: netlink.SCOPE_LINK}
	if err := h.nl.RouteReplace(r); err != nil {
		return fmt.Errorf("routing %s on link %s on %s: %w", dst, dev, h.Name, err)
	}
	return nil
}

// Neighbour returns the link-layer address the host's neighbour table
// holds for addr, and the entry's state (netlink.NUD_*); none: a nil
// address.
func (h *Host) Neighbour(addr netip.Addr) (net.HardwareAddr, int, error) {
	family := netlink.FAMILY_V4
	if addr.Is6() {
		family = netlink.FAMILY_V6
	}
	neighs, err := h.nl.NeighList(0, family)
	if err != nil {
		return nil, 0, fmt.Errorf("reading the neighbour table of %s: %w", h.Name, err)
	}
	for _, n := range neighs {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == addr {
			return n.HardwareAddr, n.State, nil
		}
	}
	return nil, 0, nil
}

// AddLocalRoute makes every address in dst local to the host with a route
// of type local on lo (`ip route add local DST dev lo`): packets to any of
// them are delivered to the host's sockets.
func (h *Host) AddLocalRoute(dst netip.Prefix) error {
	lo, err := h.nl.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("finding lo on %s: %w", h.Name, err)
	}
	r := &netlink.Route{Dst: ipNet(dst), LinkIndex: lo.Attrs().Index, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST, Table: unix.RT_TABLE_LOCAL}
	if err := h.nl.RouteReplace(r); err != nil {
		return fmt.Errorf("making %s local on %s: %w", dst, h.Name, err)
	}
	return nil
}
