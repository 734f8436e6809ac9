package dataplane

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// masqueradeMark is the packet mark bit the kernel engine sets on a new
// flow it forwards, so that postrouting masquerades it: replies must come
// back through this host to be translated back. It is not kube-proxy's
// bit (0x4000), so that the two can share a host.
const masqueradeMark = 0x20000

// kernelFamily is what differs between the kernel engine's two tables,
// ip and ip6.
type kernelFamily struct {
	table              nftables.TableFamily
	nfproto            uint32
	addrLen            uint32
	saddrOff, daddrOff uint32 // in the network header
	addrType           nftables.SetDatatype
	// portReg is the 32-bit register after an address loaded into
	// register 1: 9 after 4 bytes, 12 after 16.
	portReg uint32
}

func familyOf(a netip.Addr) kernelFamily {
	if a.Is4() {
		return kernelFamily{table: nftables.TableFamilyIPv4, nfproto: unix.NFPROTO_IPV4, addrLen: 4, saddrOff: 12, daddrOff: 16, addrType: nftables.TypeIPAddr, portReg: 9}
	}
	return kernelFamily{table: nftables.TableFamilyIPv6, nfproto: unix.NFPROTO_IPV6, addrLen: 16, saddrOff: 8, daddrOff: 24, addrType: nftables.TypeIP6Addr, portReg: 12}
}

// kernelRuleset is one nftables table of the kernel engine (one per
// address family), built from scratch or updated in place, installed in
// one transaction with the other family's.
type kernelRuleset struct {
	fam      kernelFamily
	table    *nftables.Table
	services *nftables.Chain
	conn     *nftables.Conn
	// backends is the one map of every frontend's slots: (frontend index,
	// slot) -> backend address and port. One map, so that a node's
	// backends in every frontend change in two messages.
	backends *nftables.Set
	// pending are the map's entries, added once the rules are.
	pending []nftables.SetElement
	// eligible is each backend's eligibility when the sync began: the
	// rules are built from it, and it is what they hold once installed.
	eligible map[*backend]bool
}

// addBase adds the table's hooks: new flows to a frontend's address and
// port are looked up in the services chain, from outside (prerouting) and
// from this host itself (output); flows it translated are masqueraded.
func (r *kernelRuleset) addBase() error {
	c := r.conn
	r.backends = backendsMap(r.table, r.fam)
	r.backends.ID = uint32(r.fam.table) // unique within the transaction
	if err := c.AddSet(r.backends, nil); err != nil {
		return err
	}
	r.services = c.AddChain(&nftables.Chain{Name: "services", Table: r.table})
	for _, hook := range []struct {
		name string
		hook *nftables.ChainHook
	}{{"prerouting", nftables.ChainHookPrerouting}, {"output", nftables.ChainHookOutput}} {
		ch := c.AddChain(&nftables.Chain{Name: hook.name, Table: r.table, Type: nftables.ChainTypeNAT, Hooknum: hook.hook, Priority: nftables.ChainPriorityNATDest})
		c.AddRule(&nftables.Rule{Table: r.table, Chain: ch, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: r.services.Name}}})
	}
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: r.table, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: r.table, Chain: post, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: u32(masqueradeMark), Xor: u32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: u32(0)},
		// Clear the bit again, so that nothing after this host sees it.
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: u32(^uint32(masqueradeMark)), Xor: u32(0)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		&expr.Masq{},
	}})
	return nil
}

// addFrontend adds one frontend: a services rule that matches its address,
// protocol and port, its source ranges, and the pick chain that translates
// a new flow to the backend of its slot in the backends map. Only map
// entries change when eligibility does.
func (r *kernelRuleset) addFrontend(i int, set *backendSet, slots []int) error {
	c := r.conn
	cfg := &set.cfg
	k := cfg.key()
	fe := c.AddChain(&nftables.Chain{Name: fmt.Sprintf("fe-%d", i), Table: r.table})
	pick := c.AddChain(&nftables.Chain{Name: pickChain(i), Table: r.table})
	match := append(r.matchDestination(k.addr.Addr()), matchL4(k.protocol, k.addr.Port())...)
	c.AddRule(&nftables.Rule{Table: r.table, Chain: r.services, UserData: []byte(cfg.Name),
		Exprs: append(match, &expr.Verdict{Kind: expr.VerdictGoto, Chain: fe.Name})})
	if len(cfg.SourceRanges) == 0 {
		c.AddRule(&nftables.Rule{Table: r.table, Chain: fe, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: pick.Name}}})
	}
	for _, s := range cfg.SourceRanges {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("frontend %q: source range %q: %w", cfg.Name, s, err)
		}
		if p.Addr().Is4() != k.addr.Addr().Is4() {
			continue // a range of the other family lets nobody in
		}
		c.AddRule(&nftables.Rule{Table: r.table, Chain: fe, Exprs: append(r.matchSource(p.Masked()), &expr.Verdict{Kind: expr.VerdictGoto, Chain: pick.Name})})
	}
	// Any other source falls through: no translation, a reset.
	return r.addPick(i, set, pick, slots)
}

func pickChain(i int) string { return fmt.Sprintf("fe-%d-pick", i) }

// backendsMap is the map of every frontend's slots: key frontend index .
// slot, data the address . port the slot translates to.
func backendsMap(t *nftables.Table, fam kernelFamily) *nftables.Set {
	key, _ := nftables.ConcatSetType(nftables.TypeInteger, nftables.TypeInteger)
	data, _ := nftables.ConcatSetType(fam.addrType, nftables.TypeInetService)
	return &nftables.Set{Table: t, Name: "backends", IsMap: true, KeyType: key, DataType: data}
}

// maxSlots bounds the slots of a frontend.
const maxSlots = 4096

// slotsPerWeight is how many slots a backend gets per unit of weight. The
// slots of a backend that becomes ineligible pass to others, so 4 means a
// node with one of ten backends leaving gives four of the nine left a
// quarter more new flows than the rest, and rewrites 4 entries per
// frontend: measured on the test machines, about 2 µs of kernel time per
// entry, so a node in 50 frontends is set Down in about a millisecond.
// (16 would spread within 6% for four times the entries.)
const slotsPerWeight = 4

// slotCount is the number of a frontend's slots: a fixed multiple of its
// backends' total weight, so that it need not change when eligibility does
// (that would mean replacing the rule).
func slotCount(set *backendSet) int {
	total := 0
	for _, b := range set.backends {
		total += int(b.weight.Load())
	}
	if total == 0 {
		return 0
	}
	return total * max(1, min(slotsPerWeight, maxSlots/total))
}

// assignSlots gives each of the frontend's n slots a backend index, or -1
// when no backend is eligible. Every backend owns slots in proportion to
// its weight, interleaved (smooth weighted round robin over all backends),
// and keeps them while eligible; the slots of ineligible backends go to the
// eligible ones, again by weight. A change of eligibility so moves only the
// slots of the backends that changed: few map entries to rewrite.
func assignSlots(set *backendSet, eligible map[*backend]bool, n int) []int {
	out := weightedTurns(set, func(*backend) bool { return true }, n)
	var orphaned []int
	for s, j := range out {
		if !eligible[set.backends[j]] {
			orphaned = append(orphaned, s)
		}
	}
	heirs := weightedTurns(set, func(b *backend) bool { return eligible[b] }, len(orphaned))
	for k, s := range orphaned {
		out[s] = -1
		if heirs != nil {
			out[s] = heirs[k]
		}
	}
	return out
}

// weightedTurns is n turns among the backends that include accepts, in
// proportion to their weights and interleaved (smooth weighted round
// robin); nil when none is included.
func weightedTurns(set *backendSet, include func(*backend) bool, n int) []int {
	type cand struct{ index, weight, current int }
	cs := make([]cand, 0, len(set.backends))
	total := 0
	for j, b := range set.backends {
		if include(b) {
			w := int(b.weight.Load())
			cs = append(cs, cand{index: j, weight: w})
			total += w
		}
	}
	if len(cs) == 0 {
		return nil
	}
	out := make([]int, n)
	for s := range out {
		best := 0
		for c := range cs {
			cs[c].current += cs[c].weight
			if cs[c].current > cs[best].current {
				best = c
			}
		}
		cs[best].current -= total
		out[s] = cs[best].index
	}
	return out
}

// mapKey is a backends map key: frontend index . slot.
func mapKey(i, slot int) []byte { return append(u32(uint32(i)), u32(uint32(slot))...) }

// mapElement is a backends map entry: frontend i's slot -> backend j's
// address and port (the port padded to the 4-byte register).
func mapElement(i int, set *backendSet, slot, j int) nftables.SetElement {
	ap := set.backends[j].key
	val := append(ap.Addr().AsSlice(), binaryutil.BigEndian.PutUint16(ap.Port())...)
	return nftables.SetElement{Key: mapKey(i, slot), Val: append(val, 0, 0)}
}

// addPick adds the frontend's slots to the backends map and the pick
// chain's one rule: mark the flow for masquerade and translate it to the
// address and port of its slot (a counter modulo the slots). A slot with
// no backend has no entry: the lookup misses and the flow is not
// translated, so this host's own stack, which has no socket there, answers
// it with a reset (UDP: port unreachable), as the proxy engine does.
func (r *kernelRuleset) addPick(i int, set *backendSet, pick *nftables.Chain, slots []int) error {
	if len(slots) == 0 {
		return nil
	}
	for s, j := range slots {
		if j >= 0 {
			r.pending = append(r.pending, mapElement(i, set, s, j))
		}
	}
	r.conn.AddRule(&nftables.Rule{Table: r.table, Chain: pick, Exprs: append([]expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: u32(^uint32(masqueradeMark)), Xor: u32(masqueradeMark)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
	}, r.slotKey(i, set, len(slots))...)})
	return nil
}

// clientHashSeed seeds the client-address hash of ClientIP frontends: the
// same on every replica, so that they all send a client to one backend.
const clientHashSeed = 0xebb

// slotKey puts the backends map key, frontend index . slot, in the first
// two 32-bit registers (1 and 9), looks it up (the address . port land
// from register 1 on) and DNATs to the result. The slot is a counter
// modulo the slots (round robin), or for ClientIP a hash of the client's
// address modulo the slots: a client keeps its slot, and its slot keeps
// its backend while that is eligible.
func (r *kernelRuleset) slotKey(i int, set *backendSet, n int) []expr.Any {
	key := []expr.Any{&expr.Immediate{Register: 1, Data: u32(uint32(i))}}
	if set.cfg.Balancing == ClientIP {
		key = append(key,
			&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseNetworkHeader, Offset: r.fam.saddrOff, Len: r.fam.addrLen},
			&expr.Hash{SourceRegister: 9, DestRegister: 9, Length: r.fam.addrLen, Modulus: uint32(n), Seed: clientHashSeed, Type: expr.HashTypeJenkins})
	} else {
		key = append(key, &expr.Numgen{Register: 9, Modulus: uint32(n), Type: unix.NFT_NG_INCREMENTAL})
	}
	return append(key,
		&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: r.backends.Name, SetID: r.backends.ID},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: r.fam.nfproto, RegAddrMin: 1, RegProtoMin: r.fam.portReg, Specified: true},
	)
}

// flushPending adds the map entries the rules were built with.
func (r *kernelRuleset) flushPending() error {
	return inChunks(r.pending, func(elems []nftables.SetElement) error { return r.conn.SetAddElements(r.backends, elems) })
}

// elementsPerMessage bounds the entries of one message: a netlink
// attribute's length is 16 bits, and the entries of one message are one
// attribute (about 40 bytes each).
const elementsPerMessage = 1000

// inChunks calls fn on elems in pieces of at most elementsPerMessage.
func inChunks(elems []nftables.SetElement, fn func([]nftables.SetElement) error) error {
	for len(elems) > 0 {
		n := min(len(elems), elementsPerMessage)
		if err := fn(elems[:n]); err != nil {
			return err
		}
		elems = elems[n:]
	}
	return nil
}

// changedSlots appends to gone and added the backends map entries to
// delete and add for frontend i's slots to go from was to now.
func changedSlots(gone, added []nftables.SetElement, i int, set *backendSet, was, now []int) ([]nftables.SetElement, []nftables.SetElement) {
	for s := range now {
		if was[s] == now[s] {
			continue
		}
		if was[s] >= 0 {
			gone = append(gone, nftables.SetElement{Key: mapKey(i, s)})
		}
		if now[s] >= 0 {
			added = append(added, mapElement(i, set, s, now[s]))
		}
	}
	return gone, added
}

func (r *kernelRuleset) matchDestination(a netip.Addr) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: r.fam.daddrOff, Len: r.fam.addrLen},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()},
	}
}

func (r *kernelRuleset) matchSource(p netip.Prefix) []expr.Any {
	n := r.fam.addrLen
	m := make([]byte, n)
	for b := range p.Bits() {
		m[b/8] |= 0x80 >> (b % 8)
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: r.fam.saddrOff, Len: n},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: m, Xor: make([]byte, n)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Addr().AsSlice()},
	}
}

func matchL4(p Protocol, port uint16) []expr.Any {
	proto := byte(unix.IPPROTO_TCP)
	if p == UDP {
		proto = unix.IPPROTO_UDP
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func u32(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }
