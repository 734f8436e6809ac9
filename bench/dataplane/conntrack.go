package main

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
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
func measureTracked(t *topology, addr string) (float64, error) {
	c, err := nftables.New(nftables.WithNetNSFd(t.lbNetNS()))
	if err != nil {
		return 0, fmt.Errorf("turning conntrack on: %w", err)
	}
	on := false
	set := func(want bool) error {
		if want == on {
			return nil
		}
		if want {
			addConntrackTable(c)
		} else {
			c.DelTable(&nftables.Table{Name: conntrackTable, Family: nftables.TableFamilyIPv4})
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("turning conntrack on=%t: %w", want, err)
		}
		on = want
		return nil
	}
	defer func() { _ = set(false) }()
	load := func() (int64, int64) { return t.newConnections(addr, 16, systemSlice) }
	return pairedSystemCost(systemPairs, load, load, set)
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
