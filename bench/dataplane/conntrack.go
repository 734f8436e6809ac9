package main

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// conntrackTable is an nftables table of NAT chains whose one rule
// matches nothing (protocol 255, reserved). Like any NAT table with rules
// (the kernel engine's, kube-proxy's), it turns conntrack and the NAT
// hooks on for every flow of the host; it translates nothing. (Chains
// alone do not: conntrack starts with the first NAT or ct expression.)
const conntrackTable = "ebb-bench-conntrack"

// measureTracked is what conntrack alone costs a new connection straight
// to the backend, system-wide, in µs: the direct load with the table
// above in slices alternated with the same load without it. In the routed
// topology the table sits on the load balancer's host, which forwards
// the direct load, as the kernel engine's would.
func measureTracked(t *topology, addr string, pairs int) (float64, error) {
	set, err := toggledTable(t, conntrackTable, addConntrackTable)
	if err != nil {
		return 0, err
	}
	defer func() { _ = set(false) }()
	load := func() (int64, int64) { return t.newConnections(addr, 16, systemSlice) }
	return pairedSystemCost(pairs, load, load, set)
}

// toggledTable returns a function that adds the table name (built by add)
// to the load balancer's host, or removes it, on demand: the prepare step
// of pairedSystemCost.
func toggledTable(t *topology, name string, add func(*nftables.Conn)) (func(on bool) error, error) {
	c, err := nftables.New(nftables.WithNetNSFd(t.lbNetNS()))
	if err != nil {
		return nil, fmt.Errorf("opening nftables for table %s: %w", name, err)
	}
	on := false
	return func(want bool) error {
		if want == on {
			return nil
		}
		if want {
			add(c)
		} else {
			c.DelTable(&nftables.Table{Name: name, Family: nftables.TableFamilyIPv4})
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("table %s on=%t: %w", name, want, err)
		}
		on = want
		return nil
	}, nil
}

// untrackedTable exempts the direct load's flows from conntrack (notrack
// at raw priority, before conntrack sees a packet). The kernel engine's
// own table turns conntrack on for every flow of its host, the direct
// load's too: measured against a tracked direct load, the engine's cost
// would leave out conntrack's share, which a host pays only because the
// engine runs there.
const untrackedTable = "ebb-bench-untracked"

// untrackDirect returns the prepare step of pairedSystemCost for a
// contender that turns conntrack on (the kernel engine): the direct
// slices (load false) run with untrackedTable for the flows to and from
// addr, the contender's without it.
func untrackDirect(t *topology, addr string) (func(load bool) error, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("untracking the direct load: %q is not an IPv4 address and port", addr)
	}
	set, err := toggledTable(t, untrackedTable, func(c *nftables.Conn) { addUntrackedTable(c, ap) })
	if err != nil {
		return nil, err
	}
	return func(load bool) error { return set(!load) }, nil
}

// addUntrackedTable queues untrackedTable's creation on c: in prerouting
// (flows forwarded by this host) and output (flows from it), no
// conntrack for packets to backend or from it.
func addUntrackedTable(c *nftables.Conn, backend netip.AddrPort) {
	tbl := &nftables.Table{Name: untrackedTable, Family: nftables.TableFamilyIPv4}
	c.AddTable(tbl)
	ip := backend.Addr().AsSlice()
	port := binary.BigEndian.AppendUint16(nil, backend.Port())
	// Offsets in the IPv4 header (source 12, destination 16) and the TCP
	// header (source port 0, destination port 2).
	match := func(ipOffset, portOffset uint32) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ipOffset, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ip},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: portOffset, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: port},
			&expr.Notrack{},
		}
	}
	for _, hook := range []*nftables.ChainHook{nftables.ChainHookPrerouting, nftables.ChainHookOutput} {
		ch := c.AddChain(&nftables.Chain{Name: fmt.Sprint("raw-", *hook), Table: tbl, Type: nftables.ChainTypeFilter, Hooknum: hook, Priority: nftables.ChainPriorityRaw})
		c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: match(16, 2)}) // to the backend
		c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: match(12, 0)}) // its replies
	}
}

// addConntrackTable queues conntrackTable's creation on c.
func addConntrackTable(c *nftables.Conn) {
	tbl := &nftables.Table{Name: conntrackTable, Family: nftables.TableFamilyIPv4}
	c.AddTable(tbl)
	for _, h := range []struct {
		hook     *nftables.ChainHook
		priority *nftables.ChainPriority
	}{
		{nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest},
		{nftables.ChainHookOutput, nftables.ChainPriorityNATDest},
		{nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource},
	} {
		ch := c.AddChain(&nftables.Chain{Name: fmt.Sprint("nat-", *h.hook), Table: tbl, Type: nftables.ChainTypeNAT, Hooknum: h.hook, Priority: h.priority})
		if *h.hook == *nftables.ChainHookPostrouting {
			c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{255}},
				&expr.Masq{},
			}})
		}
	}
}
