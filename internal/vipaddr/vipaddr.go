// Package vipaddr makes a host accept traffic for the load-balancer
// addresses it serves, without anyone configuring them by hand: one route of
// type local per address in the kernel's local table, as
//
//	ip route add local 198.51.100.7/32 dev lo table local proto 235
//
// would add. That is how Linux takes an address as its own (packets to it
// are delivered to local sockets, replies leave from it) without putting it
// on an interface: `ip addr` does not list it and the kernel does not
// announce it. Announcing an address to the network (BGP, ARP/NDP) is a
// separate job. IPv4 sockets can then bind the address; IPv6 ones need
// free-bind (IPV6_FREEBIND) to bind it, which the data plane sets on every
// listener anyway.
//
// The routes carry ebb's own route protocol number (Protocol), so Sync tells
// them apart from everyone else's and removes the ones no longer wanted,
// including those a previous process left. An address the host already
// treats as local by someone else's route (an address on an interface,
// 127.0.0.0/8) is left alone. Changing routes needs CAP_NET_ADMIN.
package vipaddr

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Protocol is the route protocol number of ebb's routes (unassigned in
// /etc/iproute2/rt_protos; `ip route show table local proto 235` lists them).
const Protocol netlink.RouteProtocol = 235

// Table keeps ebb's local routes in one network namespace: the namespace
// of the thread that called New.
type Table struct {
	mu sync.Mutex
	nl *netlink.Handle
	lo int
}

// New opens netlink in the calling thread's network namespace and finds its
// loopback, which the routes use.
func New() (*Table, error) {
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening netlink: %w", err)
	}
	lo, err := nl.LinkByName("lo")
	if err != nil {
		nl.Close()
		return nil, fmt.Errorf("finding the loopback interface: %w", err)
	}
	return &Table{nl: nl, lo: lo.Attrs().Index}, nil
}

// Close releases the netlink handle; the routes stay.
func (t *Table) Close() {
	t.nl.Close()
}

// Sync makes ebb's local routes exactly one per address of want. It adds
// and removes what differs and returns every error, each naming its
// address; an address that fails does not keep the others from syncing.
func (t *Table) Sync(want []netip.Addr) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	have, err := t.list()
	if err != nil {
		return err
	}
	wanted := map[netip.Addr]bool{}
	var errs []error
	for _, a := range want {
		a = a.Unmap()
		wanted[a] = true
		if have[a] {
			continue
		}
		if err := t.add(a); err != nil {
			errs = append(errs, err)
		}
	}
	for a := range have {
		if !wanted[a] {
			if err := t.nl.RouteDel(t.route(a)); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("removing the local route of %s: %w", a, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Addresses returns the addresses ebb's local routes cover, sorted.
func (t *Table) Addresses() ([]netip.Addr, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	have, err := t.list()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(have))
	for a := range have {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out, nil
}

// list returns the addresses of ebb's routes in the local table.
func (t *Table) list() (map[netip.Addr]bool, error) {
	filter := &netlink.Route{Table: unix.RT_TABLE_LOCAL, Protocol: Protocol}
	have := map[netip.Addr]bool{}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := t.nl.RouteListFiltered(family, filter, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return nil, fmt.Errorf("listing local routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			if a, ok := netip.AddrFromSlice(r.Dst.IP); ok {
				have[a.Unmap()] = true
			}
		}
	}
	return have, nil
}

// add adds the local route of a, unless the host already has a as a local
// address of its own.
func (t *Table) add(a netip.Addr) error {
	if local, err := t.isLocal(a); err != nil {
		return err
	} else if local {
		return nil
	}
	if err := t.nl.RouteAdd(t.route(a)); err != nil && !errors.Is(err, unix.EEXIST) {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("adding a local route for %s: %w (ebb lb needs CAP_NET_ADMIN, or --local-routes=false and the address configured on the host)", a, err)
		}
		return fmt.Errorf("adding a local route for %s: %w", a, err)
	}
	return nil
}

// isLocal reports whether the kernel already delivers a's traffic locally
// through a route that is not ebb's.
func (t *Table) isLocal(a netip.Addr) (bool, error) {
	routes, err := t.nl.RouteGet(a.AsSlice())
	if err != nil {
		// No route at all (an unreachable IPv6 network): not local.
		if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) {
			return false, nil
		}
		return false, fmt.Errorf("looking up the route of %s: %w", a, err)
	}
	for _, r := range routes {
		if r.Type == unix.RTN_LOCAL {
			return true, nil
		}
	}
	return false, nil
}

func (t *Table) route(a netip.Addr) *netlink.Route {
	bits := 32
	family := netlink.FAMILY_V4
	if a.Is6() {
		bits, family = 128, netlink.FAMILY_V6
	}
	return &netlink.Route{
		LinkIndex: t.lo,
		Dst:       &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)},
		Table:     unix.RT_TABLE_LOCAL,
		Type:      unix.RTN_LOCAL,
		Scope:     netlink.SCOPE_HOST,
		Protocol:  Protocol,
		Family:    family,
	}
}
