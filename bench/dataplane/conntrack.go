package main

import (
	"fmt"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// conntrackTable is an nftables table of NAT chains whose one rule
// matches nothing (protocol 255, reserved). Like any NAT table with rules
// (the kernel engine's, kube-proxy's), it turns conntrack and the NAT
// hooks on for every flow of the host; it translates nothing. (Chains
// alone do not: conntrack starts with the first NAT or ct expression.)
const conntrackTable = "ebb-bench-conntrack"

// measureTracked is the new-connection load straight to the backend, as
// measureDirect's, with conntrack on: its busy time per connection minus
// base's is what conntrack alone costs a flow, of the kernel engine's
// system-wide figure.
func measureTracked(t *topology, addr string, d time.Duration, base direct) (float64, error) {
	c, err := nftables.New(nftables.WithNetNSFd(t.lbNetNS()))
	if err != nil {
		return 0, fmt.Errorf("turning conntrack on: %w", err)
	}
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
	if err := c.Flush(); err != nil {
		return 0, fmt.Errorf("turning conntrack on: %w", err)
	}
	defer func() {
		c.DelTable(tbl)
		_ = c.Flush()
	}()
	conn := measureCost(0, func() (int64, int64) { return t.newConnections(addr, 16, d) })
	return perOp(conn.total, conn.ops) - base.connSystem, nil
}
