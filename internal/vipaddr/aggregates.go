package vipaddr

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// SyncAggregates makes ebb's blackhole routes in the main table exactly
// one per prefix of want: the aggregates this host announces by BGP
// (AnnouncementPolicy aggregationLength). Routers send the host every
// address of an aggregate; the addresses it serves are local (Sync) and
// the local table wins, and the rest end here, dropped, instead of
// following the host's default route back to the router and looping
// until their TTL runs out.
func (t *Table) SyncAggregates(want []netip.Prefix) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	have, err := t.listBlackholes()
	if err != nil {
		return err
	}
	wanted := map[netip.Prefix]bool{}
	var errs []error
	for _, p := range want {
		p = p.Masked()
		wanted[p] = true
		if have[p] {
			continue
		}
		if err := t.nl.RouteAdd(blackhole(p)); err != nil && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("adding a blackhole route for the aggregate %s: %w", p, err))
		}
	}
	for p := range have {
		if !wanted[p] {
			if err := t.nl.RouteDel(blackhole(p)); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("removing the blackhole route of %s: %w", p, err))
			}
		}
	}
	return errors.Join(errs...)
}

// listBlackholes returns the prefixes of ebb's blackhole routes.
func (t *Table) listBlackholes() (map[netip.Prefix]bool, error) {
	filter := &netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: Protocol, Type: unix.RTN_BLACKHOLE}
	have := map[netip.Prefix]bool{}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := t.nl.RouteListFiltered(family, filter, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TYPE)
		if err != nil {
			return nil, fmt.Errorf("listing blackhole routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			a, ok := netip.AddrFromSlice(r.Dst.IP)
			if !ok {
				continue
			}
			bits, _ := r.Dst.Mask.Size()
			have[netip.PrefixFrom(a.Unmap(), bits)] = true
		}
	}
	return have, nil
}

func blackhole(p netip.Prefix) *netlink.Route {
	family := netlink.FAMILY_V4
	if p.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	return &netlink.Route{
		Dst:      &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())},
		Table:    unix.RT_TABLE_MAIN,
		Type:     unix.RTN_BLACKHOLE,
		Protocol: Protocol,
		Family:   family,
	}
}
