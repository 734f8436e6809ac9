// Package vipguard keeps a load-balancer host's own services off the
// addresses it serves. A served address is local to the host (vipaddr), so
// without a guard every socket bound to the wildcard address (sshd, the
// kubelet, node-exporter, kube-proxy's health port, the node-agent) answers
// on every public address ebb announces, and loadBalancerSourceRanges does
// not apply to them.
//
// The guard is one nftables table (family inet, so IPv4 and IPv6 alike)
// with one chain at the prerouting hook, before any NAT: a packet to a
// guarded address passes only if it comes from the host itself (the
// loopback), if it is a later fragment (no ports: its first fragment was
// checked), if its protocol and port are a frontend's, if it belongs to an
// established connection of that very address (one still draining on a
// frontend just removed; never a listener on every address such as
// sshd's), if it is ICMP (ping, and the errors
// path MTU discovery needs), or, where the kernel engine's nftables path
// runs conntrack anyway (State.Tracked), if conntrack tracks its
// connection (that path's flows of a removed frontend drain). Everything
// else to a guarded address is counted and dropped, without an answer, as
// a firewall would. Because it runs before NAT, node ports that a proxy in
// iptables mode exposes on every local address are closed on the guarded
// addresses too.
//
//	table inet ebb-guard {
//	  chain prerouting {
//	    type filter hook prerouting priority -160; policy accept;
//	    iifname "lo" accept
//	    ip frag-off & 0x1fff != 0 accept
//	    exthdr frag frag-off != 0 accept
//	    ip daddr . meta l4proto . th dport @ports4 accept
//	    ip6 daddr . meta l4proto . th dport @ports6 accept
//	    socket wildcard 0 accept
//	    ct state established,related accept   # only with State.Tracked
//	    meta l4proto { icmp, ipv6-icmp } accept
//	    ip daddr @addresses4 counter drop
//	    ip6 daddr @addresses6 counter drop
//	  }
//	}
//
// The priority is after connection tracking (-200) and before mangle
// (-150) and destination NAT (-100). The guard never turns conntrack on by
// itself (its ct rule is there only where conntrack runs anyway): in a
// namespace without it, a flood of forged source ports would fill its
// table, and the kernel would drop new connections, legitimate ones too.
// Changing what is guarded changes only the sets' elements, in one
// transaction. With no address to guard there is no table.
package vipguard

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/ebbdev/ebb/internal/nftstate"
)

// DefaultTable names the nftables table (family inet).
const DefaultTable = "ebb-guard"

// priority is the chain's: after conntrack, before mangle and NAT.
const priority = -160

// Port is a frontend: traffic to Addr on Protocol (unix.IPPROTO_TCP or
// unix.IPPROTO_UDP) and Port passes.
type Port struct {
	Addr     netip.Addr
	Protocol uint8
	Port     uint16
}

func (p Port) String() string {
	name := "tcp"
	if p.Protocol == unix.IPPROTO_UDP {
		name = "udp"
	}
	return name + "/" + netip.AddrPortFrom(p.Addr, p.Port).String()
}

// State is what the guard does.
type State struct {
	// Addresses are guarded: only the Ports reach them.
	Addresses []netip.Addr
	// Ports are the frontends; those on unguarded addresses change nothing.
	Ports []Port
	// Tracked lets the connections conntrack tracks pass too: set where
	// conntrack runs anyway (the kernel engine's nftables path), so that
	// the flows of a frontend just removed drain. The guard never turns
	// conntrack on by itself: a flood of forged source ports would fill
	// its table.
	Tracked bool
}

// Guard owns the table.
type Guard struct {
	table string
	netns int

	mu sync.Mutex
	// last is the state installed; nil: the table is not known to be this
	// process's (the next Sync writes it whole).
	last *State
}

// New returns a guard of the table name in the network namespace netns
// (a file descriptor; 0: this process's). Nothing is installed until Sync.
func New(table string, netns int) *Guard {
	if table == "" {
		table = DefaultTable
	}
	return &Guard{table: table, netns: netns}
}

func (g *Guard) conn() (*nftables.Conn, error) { return nftstate.Conn(g.netns) }

// Sync makes the table guard s in one transaction. The first Sync of a
// Guard (and the first after Repair finds the table gone) replaces the
// whole table, whoever wrote it before (an earlier ebb lb); later ones
// change only the sets. An unchanged state is not written again.
func (g *Guard) Sync(s State) error {
	s = normalise(s)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.last != nil && equal(*g.last, s) {
		return nil
	}
	if len(s.Addresses) == 0 {
		// Nothing to guard: no table (its connection-tracking rule would
		// turn conntrack on in the namespace for nothing).
		if err := g.removeLocked(); err != nil {
			return err
		}
		g.last = &s
		return nil
	}
	if err := g.write(s, g.last == nil || len(g.last.Addresses) == 0 || g.last.Tracked != s.Tracked); err != nil {
		return err
	}
	g.last = &s
	return nil
}

// write writes s: the whole table (whole), or only the sets' elements.
func (g *Guard) write(s State, whole bool) error {
	c, err := g.conn()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	defer c.CloseLasting()
	t := &nftables.Table{Name: g.table, Family: nftables.TableFamilyINet}
	sets := newSets(t)
	if whole {
		// Add, delete and add again: the table ends up new, whether or
		// not one was there (deleting a missing table would fail).
		c.AddTable(t)
		c.DelTable(t)
		c.AddTable(t)
		for _, set := range sets.all() {
			if err := c.AddSet(set, nil); err != nil {
				return fmt.Errorf("adding set %s: %w", set.Name, err)
			}
		}
		chain := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(priority)})
		for _, exprs := range sets.rules(s) {
			c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: exprs})
		}
	} else {
		for _, set := range sets.all() {
			c.FlushSet(set)
		}
	}
	for set, elems := range sets.elements(s) {
		if len(elems) == 0 {
			continue
		}
		if err := c.SetAddElements(set, elems); err != nil {
			return fmt.Errorf("adding the elements of set %s: %w", set.Name, err)
		}
	}
	if err := c.Flush(); err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("installing nftables table inet %s: %w (needs CAP_NET_ADMIN)", g.table, err)
		}
		return fmt.Errorf("installing nftables table inet %s: %w", g.table, err)
	}
	return nil
}

// Repair writes the table whole again if it is not as Sync left it (a
// firewall reload ran `nft flush ruleset`, someone deleted the table or a
// rule), and reports whether it had to. Before the first Sync it does
// nothing.
func (g *Guard) Repair() (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.last == nil || len(g.last.Addresses) == 0 {
		return false, nil
	}
	ok, err := g.intact()
	if err != nil || ok {
		return false, err
	}
	if err := g.write(*g.last, true); err != nil {
		return true, fmt.Errorf("repairing: %w", err)
	}
	return true, nil
}

// intact reports whether the table has its chain with every rule and the
// sets hold as many elements as last written.
func (g *Guard) intact() (bool, error) {
	c, err := g.conn()
	if err != nil {
		return false, fmt.Errorf("opening nftables: %w", err)
	}
	defer c.CloseLasting()
	t := &nftables.Table{Name: g.table, Family: nftables.TableFamilyINet}
	sets := newSets(t)
	if n, err := nftstate.Rules(c, t, "prerouting"); err != nil || n != len(sets.rules(*g.last)) {
		return false, err
	}
	for set, want := range sets.elements(*g.last) {
		if n, err := nftstate.Elements(c, set); err != nil || n != len(want) {
			return false, err
		}
	}
	return true, nil
}

// Dropped returns how many packets the guard dropped since its table was
// last written whole.
func (g *Guard) Dropped() (uint64, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.last == nil || len(g.last.Addresses) == 0 {
		return 0, nil
	}
	c, err := g.conn()
	if err != nil {
		return 0, fmt.Errorf("opening nftables: %w", err)
	}
	defer c.CloseLasting()
	t := &nftables.Table{Name: g.table, Family: nftables.TableFamilyINet}
	rules, err := c.GetRules(t, &nftables.Chain{Name: "prerouting", Table: t})
	if err != nil {
		return 0, fmt.Errorf("reading table inet %s: %w", g.table, err)
	}
	var n uint64
	for _, r := range rules {
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				n += ctr.Packets
			}
		}
	}
	return n, nil
}

// Remove deletes the table: nothing is guarded any more.
func (g *Guard) Remove() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.removeLocked(); err != nil {
		return err
	}
	g.last = nil
	return nil
}

// removeLocked deletes the table if it is there; g.mu is held.
func (g *Guard) removeLocked() error {
	c, err := g.conn()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	defer c.CloseLasting()
	c.DelTable(&nftables.Table{Name: g.table, Family: nftables.TableFamilyINet})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing table inet %s: %w", g.table, err)
	}
	return nil
}

func normalise(s State) State {
	out := State{Tracked: s.Tracked}
	guarded := map[netip.Addr]bool{}
	for _, a := range s.Addresses {
		a = a.Unmap()
		guarded[a] = true
		out.Addresses = append(out.Addresses, a)
	}
	for _, p := range s.Ports {
		p.Addr = p.Addr.Unmap()
		// A port of an unguarded address would only cost a set element.
		if guarded[p.Addr] {
			out.Ports = append(out.Ports, p)
		}
	}
	slices.SortFunc(out.Addresses, func(a, b netip.Addr) int { return a.Compare(b) })
	out.Addresses = slices.Compact(out.Addresses)
	slices.SortFunc(out.Ports, comparePorts)
	out.Ports = slices.Compact(out.Ports)
	return out
}

func comparePorts(a, b Port) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if a.Protocol != b.Protocol {
		return int(a.Protocol) - int(b.Protocol)
	}
	return int(a.Port) - int(b.Port)
}

func equal(a, b State) bool {
	return a.Tracked == b.Tracked && slices.Equal(a.Addresses, b.Addresses) && slices.Equal(a.Ports, b.Ports)
}
