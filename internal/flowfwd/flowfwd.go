// Package flowfwd keeps established connections alive when the routers
// move them between load-balancer hosts. When an LB host withdraws its
// announcements (its node is leaving), the routers' ECMP sends the packets
// of the connections it still serves to the other LB hosts, which know
// nothing of them and would answer with a reset. With flowfwd, each
// serving LB host sends a TCP segment of a flow it does not know (no
// connection tracking entry, not a SYN: a flow that was established
// somewhere else) on to the LB hosts that are draining, unchanged (the
// destination stays the load-balancer address, which is local there too),
// and one of them still has the connection. A draining host drops such
// segments instead of resetting them, since the flow may be another
// draining host's, and so does every host with a segment another host
// forwarded to it (marked with DSCP 7). Segments of this host's own flows,
// new connections, and segments to a port that is no TCP frontend's are
// never touched. It is what GitHub's GLB calls a second chance, done with
// two nftables rules (mark, `dup to` each draining host, then `drop`).
//
// It needs connection tracking on the host (kube-proxy's rules and the
// rule itself turn it on): a flow established before that would look
// foreign, so the table is installed when the process starts, well before
// any host drains.
package flowfwd

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/ebbdev/ebb/internal/nftstate"
)

// DefaultTable names the nftables table (family ip).
const DefaultTable = "ebb-flows"

// State is what the rule does.
type State struct {
	// Frontends are the TCP frontends served here: their addresses and
	// ports (IPv4; IPv6 ones are ignored for now). Segments to any other
	// port are left alone.
	Frontends []netip.AddrPort
	// Draining: this host is leaving; foreign segments are dropped.
	Draining bool
	// Peers are the other LB hosts that are draining (their addresses on
	// the node network); foreign segments go to each of them.
	Peers []netip.Addr
}

// Mode is what the rule does with a foreign segment.
type Mode string

// Modes.
const (
	// ModePass: no draining peer and not draining: the host answers the
	// segment as it always would (a reset).
	ModePass Mode = "pass"
	// ModeForward: sent to every draining peer.
	ModeForward Mode = "forward"
	// ModeDrop: this host drains; dropped without a reset.
	ModeDrop Mode = "drop"
)

func (s State) mode() Mode {
	switch {
	case s.Draining:
		return ModeDrop
	case len(s.Peers) > 0:
		return ModeForward
	}
	return ModePass
}

// Forwarder owns the table.
type Forwarder struct {
	table string
	netns int

	mu   sync.Mutex
	last *State
}

// New returns a forwarder of the table name in the network namespace netns
// (a file descriptor; 0: this process's). Nothing is installed until Sync.
func New(table string, netns int) *Forwarder {
	if table == "" {
		table = DefaultTable
	}
	return &Forwarder{table: table, netns: netns}
}

func (f *Forwarder) conn() (*nftables.Conn, error) { return nftstate.Conn(f.netns) }

// Sync makes the table do what s says, in one transaction (the previous
// rule stays until the new one replaces it). An unchanged state is not
// written again.
func (f *Forwarder) Sync(s State) error {
	s = normalise(s)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last != nil && equal(*f.last, s) {
		return nil
	}
	return f.syncLocked(s)
}

// syncLocked writes s; f.mu is held.
func (f *Forwarder) syncLocked(s State) error {
	c, err := f.conn()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	defer c.CloseLasting()
	t := &nftables.Table{Name: f.table, Family: nftables.TableFamilyIPv4}
	if f.last == nil {
		// This process's first write replaces the table whole, whoever
		// wrote it (a predecessor, an earlier version with other sets):
		// added, deleted and added again in the one transaction, so
		// nothing is left unforwarded in between.
		c.AddTable(t)
		c.DelTable(t)
	}
	c.AddTable(t)
	chain := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle})
	set := frontendsSet(t)
	if err := c.AddSet(set, nil); err != nil {
		return fmt.Errorf("adding the frontends set: %w", err)
	}
	c.FlushSet(set)
	var elems []nftables.SetElement
	for _, fe := range s.Frontends {
		elems = append(elems, nftables.SetElement{Key: append(fe.Addr().AsSlice(), byte(fe.Port()>>8), byte(fe.Port()), 0, 0)})
	}
	if len(elems) > 0 {
		if err := c.SetAddElements(set, elems); err != nil {
			return fmt.Errorf("adding the frontends: %w", err)
		}
	}
	c.FlushChain(chain)
	for _, exprs := range ruleExprs(set, s) {
		c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: exprs})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing nftables table ip %s: %w", f.table, err)
	}
	f.last = &s
	return nil
}

// frontendsSet is the set of the TCP frontends: address . port.
func frontendsSet(t *nftables.Table) *nftables.Set {
	key, _ := nftables.ConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)
	return &nftables.Set{Name: "frontends", Table: t, KeyType: key, Concatenation: true}
}

// forwardedDSCP marks the segments a host forwards (DSCP 7, from the pool
// RFC 2474 leaves for local use), so that the host receiving one never
// forwards it again.
const forwardedDSCP = 7

// ruleExprs are the chain's rules. Each matches a foreign segment: to a
// frontend (ip daddr . tcp dport @frontends), TTL above 1, TCP, not a SYN,
// no tracked connection (new or invalid); each counts what it matches.
// A segment that another host forwarded (marked) is dropped: this host
// does not have its connection, and another host it was sent to may. The
// others are, while forwarding, marked, sent to each peer (dup) and
// dropped; while draining, dropped; else passed (the usual reset).
//
// The mark keeps two hosts that forward to each other for a while (one
// joining while the other still counts it draining) from bouncing a
// segment neither knows: each forwards it once. The TTL still bounds a
// longer loop (three hosts that disagree). nf_dup lowers the TTL of each
// copy it sends from prerouting, but does not stop at 0: without the
// check a TTL of 0 went round to 255.
func ruleExprs(set *nftables.Set, s State) [][]expr.Any {
	drop := &expr.Verdict{Kind: expr.VerdictDrop}
	switch s.mode() {
	case ModeForward:
		forward := append(foreignExprs(set), marked(false)...)
		forward = append(forward, &expr.Counter{})
		forward = append(forward, markForwarded()...)
		for _, p := range s.Peers {
			forward = append(forward,
				&expr.Immediate{Register: 1, Data: p.AsSlice()},
				&expr.Dup{RegAddr: 1})
		}
		forward = append(forward, drop)
		return [][]expr.Any{
			append(append(foreignExprs(set), marked(true)...), &expr.Counter{}, drop),
			forward,
		}
	case ModeDrop:
		return [][]expr.Any{append(foreignExprs(set), &expr.Counter{}, drop)}
	}
	return [][]expr.Any{
		append(append(foreignExprs(set), marked(true)...), &expr.Counter{}, drop),
		append(foreignExprs(set), &expr.Counter{}),
	}
}

// foreignExprs match a segment of a flow this host does not know, to a
// frontend.
func foreignExprs(set *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		// ip daddr . tcp dport @frontends
		&expr.Payload{OperationType: expr.PayloadLoad, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4, DestRegister: 1},
		&expr.Payload{OperationType: expr.PayloadLoad, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2, DestRegister: 9},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
		// ip ttl > 1
		&expr.Payload{OperationType: expr.PayloadLoad, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 1, DestRegister: 1},
		&expr.Cmp{Op: expr.CmpOpGt, Register: 1, Data: []byte{1}},
		// tcp flags & syn == 0
		&expr.Payload{OperationType: expr.PayloadLoad, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1, DestRegister: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x02}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0}},
		// ct state new,invalid
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: u32(expr.CtStateBitNEW | expr.CtStateBitINVALID), Xor: u32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: u32(0)},
	}
}

// marked matches a segment whose DSCP is (or is not) forwardedDSCP.
func marked(is bool) []expr.Any {
	op := expr.CmpOpEq
	if !is {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Payload{OperationType: expr.PayloadLoad, Base: expr.PayloadBaseNetworkHeader, Offset: 1, Len: 1, DestRegister: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0xfc}, Xor: []byte{0}},
		&expr.Cmp{Op: op, Register: 1, Data: []byte{forwardedDSCP << 2}},
	}
}

// markForwarded sets the segment's DSCP to forwardedDSCP, keeping its ECN
// bits, and updates the header checksum (ip dscp set 7).
func markForwarded() []expr.Any {
	return []expr.Any{
		&expr.Payload{OperationType: expr.PayloadLoad, Base: expr.PayloadBaseNetworkHeader, Offset: 1, Len: 1, DestRegister: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x03}, Xor: []byte{forwardedDSCP << 2}},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 1, Len: 1,
			CsumType: expr.CsumTypeInet, CsumOffset: 10},
	}
}

// Segments returns how many foreign segments the current rule has seen,
// and what it does with them.
func (f *Forwarder) Segments() (uint64, Mode, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last == nil {
		return 0, ModePass, nil
	}
	c, err := f.conn()
	if err != nil {
		return 0, "", err
	}
	defer c.CloseLasting()
	t := &nftables.Table{Name: f.table, Family: nftables.TableFamilyIPv4}
	rules, err := c.GetRules(t, &nftables.Chain{Name: "prerouting", Table: t})
	if err != nil {
		return 0, "", fmt.Errorf("reading table ip %s: %w", f.table, err)
	}
	var segs uint64
	counters := 0
	for _, r := range rules {
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				segs += ctr.Packets
				counters++
			}
		}
	}
	if counters == 0 {
		return 0, f.last.mode(), errors.New("the rules have no counter")
	}
	return segs, f.last.mode(), nil
}

// Repair writes the table whole again if it is not as Sync left it (a
// firewall reload ran `nft flush ruleset`, someone deleted the table or a
// rule), and reports whether it had to. Before the first Sync it does
// nothing. Connections established while the table was gone look foreign
// to no one: conntrack kept tracking them (kube-proxy's rules need it).
func (f *Forwarder) Repair() (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last == nil {
		return false, nil
	}
	ok, err := f.intact(*f.last)
	if err != nil || ok {
		return false, err
	}
	last := *f.last
	f.last = nil // the next write replaces the table whole
	if err := f.syncLocked(last); err != nil {
		f.last = &last
		return true, fmt.Errorf("repairing: %w", err)
	}
	return true, nil
}

// intact reports whether the table holds s's rules and frontends.
func (f *Forwarder) intact(s State) (bool, error) {
	c, err := f.conn()
	if err != nil {
		return false, fmt.Errorf("opening nftables: %w", err)
	}
	defer c.CloseLasting()
	t := &nftables.Table{Name: f.table, Family: nftables.TableFamilyIPv4}
	set := frontendsSet(t)
	if n, err := nftstate.Rules(c, t, "prerouting"); err != nil || n != len(ruleExprs(set, s)) {
		return false, err
	}
	n, err := nftstate.Elements(c, set)
	return err == nil && n == len(s.Frontends), err
}

// Remove deletes the table: nothing forwards any more.
func (f *Forwarder) Remove() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.conn()
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	c.DelTable(&nftables.Table{Name: f.table, Family: nftables.TableFamilyIPv4})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing table ip %s: %w", f.table, err)
	}
	f.last = nil
	return nil
}

func normalise(s State) State {
	out := State{Draining: s.Draining}
	for _, fe := range s.Frontends {
		if a := fe.Addr().Unmap(); a.Is4() {
			out.Frontends = append(out.Frontends, netip.AddrPortFrom(a, fe.Port()))
		}
	}
	for _, p := range s.Peers {
		if p = p.Unmap(); p.Is4() {
			out.Peers = append(out.Peers, p)
		}
	}
	cmp := func(a, b netip.Addr) int { return a.Compare(b) }
	slices.SortFunc(out.Frontends, netip.AddrPort.Compare)
	slices.SortFunc(out.Peers, cmp)
	out.Frontends = slices.Compact(out.Frontends)
	out.Peers = slices.Compact(out.Peers)
	return out
}

func equal(a, b State) bool {
	return a.Draining == b.Draining && slices.Equal(a.Frontends, b.Frontends) && slices.Equal(a.Peers, b.Peers)
}

func u32(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }
