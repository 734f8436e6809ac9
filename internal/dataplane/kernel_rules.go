package dataplane

import (
	"fmt"
	"math"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// masqueradeMark is the packet mark bit the kernel engine sets on a new
// flow it translates itself, so that postrouting masquerades it: replies
// must come back through this host to be translated back. It is not
// kube-proxy's bit (0x4000), so that the two can share a host.
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
	// labelReg is the 32-bit register after the port: where a backends
	// map value's flow label lands.
	labelReg uint32
	// csumType and csumOff say how the network header's checksum is kept
	// when its address is rewritten: IPv4's, at offset 10; none for
	// IPv6, which has no header checksum.
	csumType expr.PayloadCsumType
	csumOff  uint32
}

func familyOf(a netip.Addr) kernelFamily {
	if a.Is4() {
		return kernelFamily{table: nftables.TableFamilyIPv4, nfproto: unix.NFPROTO_IPV4, addrLen: 4, saddrOff: 12, daddrOff: 16, addrType: nftables.TypeIPAddr, portReg: 9, labelReg: 10, csumType: expr.CsumTypeInet, csumOff: 10}
	}
	return kernelFamily{table: nftables.TableFamilyIPv6, nfproto: unix.NFPROTO_IPV6, addrLen: 16, saddrOff: 8, daddrOff: 24, addrType: nftables.TypeIP6Addr, portReg: 12, labelReg: 13, csumType: expr.CsumTypeNone}
}

// familyOfTable is the kernelFamily of a table family.
func familyOfTable(t nftables.TableFamily) kernelFamily {
	if t == nftables.TableFamilyIPv4 {
		return familyOf(netip.IPv4Unspecified())
	}
	return familyOf(netip.IPv6Unspecified())
}

// kernelRuleset is one nftables table of the kernel engine (one per
// address family), built from scratch or updated in place, installed in
// one transaction with the other family's.
type kernelRuleset struct {
	fam      kernelFamily
	table    *nftables.Table
	services *nftables.Chain
	conn     *nftables.Conn
	// The maps of every frontend's slots (see kernel_slots.go): one set
	// of maps for all frontends, so that a node's backends in every
	// frontend change in a few messages.
	homes, owners, backends *nftables.Set
	// pending are the maps' entries, added once the rules are.
	pending map[*nftables.Set][]nftables.SetElement
	// reused says to add the reused-port chains (kernel_reused.go).
	reused bool
}

// kernelMaps are a table's three maps. The IDs name them within a
// transaction that also creates them.
//
// Their integers (frontend index, slot, owner, state) are 32 bits in host
// byte order, which is nft's mark type. The kernel cares about none of
// this; the nft tool does: with the generic integer type it cannot tell a
// concatenated key's fields apart and aborts listing the maps. Typed so,
// with the fields' lengths (Concatenation) and the keys' byte order, `nft
// list map` prints them (values still byte-swapped: nft assumes network
// order for them).
func kernelMaps(t *nftables.Table, fam kernelFamily) (homes, owners, backends *nftables.Set) {
	hostInt := nftables.TypeMark
	slot, _ := nftables.ConcatSetType(hostInt, hostInt)
	slotState, _ := nftables.ConcatSetType(hostInt, hostInt, hostInt)
	// The flow label is typed as an IPv6 address, 16 bytes too: the nft
	// tool cannot print a concatenation with its own ct_label type.
	dest, _ := nftables.ConcatSetType(fam.addrType, nftables.TypeInetService, nftables.TypeIP6Addr)
	id := 3 * uint32(fam.table)
	homes = &nftables.Set{Table: t, Name: "homes", ID: id, IsMap: true, Concatenation: true, KeyType: slot, DataType: hostInt, KeyByteOrder: binaryutil.NativeEndian}
	owners = &nftables.Set{Table: t, Name: "owners", ID: id + 1, IsMap: true, KeyType: hostInt, DataType: hostInt, KeyByteOrder: binaryutil.NativeEndian}
	backends = &nftables.Set{Table: t, Name: "backends", ID: id + 2, IsMap: true, Concatenation: true, KeyType: slotState, DataType: dest, KeyByteOrder: binaryutil.NativeEndian}
	return homes, owners, backends
}

// addBase adds the table's hooks, all of them NAT chains, which the
// kernel runs for the first packet of a flow only:
//
//   - prerouting and output (flows from outside, and from this host
//     itself), just before the NAT chains of kube-proxy and the like
//     (dstnat - 1): a new flow to a frontend's address and port is
//     looked up in the services chain, which picks its backend, rewrites
//     the packet's destination to it and labels the flow's conntrack
//     entry with it (flowLabelOf), translating nothing itself;
//   - prerouting-bind and output-bind, just after them (dstnat + 1):
//     a labelled flow that no NAT chain translated since is translated
//     to the destination the packet now has, and marked for masquerade;
//   - postrouting masquerades the marked flows.
//
// The two steps are what lets a backend be this host's own node port.
// A flow gets one destination translation: had ebb's chain translated it
// to the node port, kube-proxy's translation of the node port to a pod
// would never apply, and the flow would reach a port nothing listens on.
// Rewritten but not translated, the flow is kube-proxy's to translate;
// conntrack still holds the frontend as the flow's original destination,
// so the replies leave with the frontend's address and port. A flow to
// another host, or to a socket of this host, is translated by the bind
// chain.
func (r *kernelRuleset) addBase() error {
	c := r.conn
	r.homes, r.owners, r.backends = kernelMaps(r.table, r.fam)
	for _, m := range []*nftables.Set{r.homes, r.owners, r.backends} {
		if err := c.AddSet(m, nil); err != nil {
			return err
		}
	}
	r.services = c.AddChain(&nftables.Chain{Name: "services", Table: r.table})
	for _, hook := range []struct {
		name string
		hook *nftables.ChainHook
	}{{"prerouting", nftables.ChainHookPrerouting}, {"output", nftables.ChainHookOutput}} {
		pick := c.AddChain(&nftables.Chain{Name: hook.name, Table: r.table, Type: nftables.ChainTypeNAT, Hooknum: hook.hook, Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityNATDest - 1)})
		c.AddRule(&nftables.Rule{Table: r.table, Chain: pick, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: r.services.Name}}})
		bind := c.AddChain(&nftables.Chain{Name: hook.name + "-bind", Table: r.table, Type: nftables.ChainTypeNAT, Hooknum: hook.hook, Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityNATDest + 1)})
		c.AddRule(&nftables.Rule{Table: r.table, Chain: bind, Exprs: r.bindExprs()})
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
	if r.reused {
		r.addReusedPortChains()
	}
	return nil
}

// bindExprs are the bind chains' rule: a flow whose conntrack entry has
// ebb's label (and that no NAT chain translated, or this chain would not
// run) is marked for masquerade and translated to the packet's
// destination, which the pick rule rewrote to the backend's.
func (r *kernelRuleset) bindExprs() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeyLABELS, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{flowLabelMarker}},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: u32(^uint32(masqueradeMark)), Xor: u32(masqueradeMark)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: r.fam.daddrOff, Len: r.fam.addrLen},
		&expr.Payload{DestRegister: r.fam.portReg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: r.fam.nfproto, RegAddrMin: 1, RegProtoMin: r.fam.portReg, Specified: true},
	}
}

// addFrontend adds one frontend: a services rule that matches its address,
// protocol and port, its source ranges, and the pick chain that translates
// a new flow to the backend of its slot in the maps. Only map entries
// change when eligibility does.
func (r *kernelRuleset) addFrontend(i int, set *backendSet, plan *slotPlan) error {
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
	return r.addPick(i, set, pick, plan)
}

func pickChain(i int) string { return fmt.Sprintf("fe-%d-pick", i) }

// maxSlots bounds the slots of a frontend.
const maxSlots = 4096

// slotsPerWeight is how many slots a backend gets per unit of weight. The
// slots of a backend that becomes ineligible pass to others, so 4 means a
// node with one of ten backends leaving gives four of the nine left a
// quarter more new flows than the rest (16 would spread within 6%). A
// node's change costs one owners entry whatever the slots, but every slot
// is three map entries to write when the tables are rebuilt.
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
// eligible ones (see slotHomes). A change of eligibility so moves only the
// slots of the backends that changed: few map entries to rewrite.
func assignSlots(set *backendSet, eligible func(*backend) bool, n int) []int {
	return newSlotHomes(set, n).assignAll(set, func(j int) bool { return eligible(set.backends[j]) })
}

// slotHomes is what a frontend's slots are whatever the backends'
// eligibility: each slot's home backend (the one that holds it when every
// backend is eligible), which of its home's slots it is, and the heirs of
// each backend's slots in turn.
//
// A slot whose home is not eligible goes to its heir: the heirs of one
// backend's slots take turns among the other backends by weight (smooth
// weighted round robin, starting at a place that depends on the backend,
// so that two leaving backends do not both favour the same heirs); a slot
// whose heir is not eligible either goes to the eligible backend that ranks
// first for it by weighted rendezvous hashing. Neither choice depends on
// which other backends are eligible, so a slot moves only when its own
// backend or its heir changes: a node that leaves moves the slots it holds
// and no other (the kernel engine's prepared entries stay valid; see
// kernel_slots.go).
type slotHomes struct {
	home, nth []int
	heirs     [][]int
}

func newSlotHomes(set *backendSet, n int) slotHomes {
	return slotHomesFrom(set, weightedTurns(set, func(int) bool { return true }, n))
}

// slotHomesFrom is the slots of the given homes.
func slotHomesFrom(set *backendSet, home []int) slotHomes {
	h := slotHomes{home: home, nth: make([]int, len(home)), heirs: make([][]int, len(set.backends))}
	count := make([]int, len(set.backends))
	for s, j := range home {
		h.nth[s] = count[j]
		count[j]++
	}
	for j, n := range count {
		turns := weightedTurns(set, func(h int) bool { return h != j }, n)
		if len(turns) > 0 {
			k := j % len(turns)
			h.heirs[j] = append(turns[k:], turns[:k]...)
		}
	}
	return h
}

// assign is the backend of slot s under eligible, or -1.
func (h slotHomes) assign(set *backendSet, s int, eligible func(j int) bool) int {
	j := h.home[s]
	if eligible(j) {
		return j
	}
	if turns := h.heirs[j]; len(turns) > 0 {
		if heir := turns[h.nth[s]%len(turns)]; eligible(heir) {
			return heir
		}
	}
	return rendezvousHeir(set, s, eligible)
}

// assignAll is every slot's backend under eligible.
func (h slotHomes) assignAll(set *backendSet, eligible func(j int) bool) []int {
	out := make([]int, len(h.home))
	for s := range out {
		out[s] = h.assign(set, s, eligible)
	}
	return out
}

// rendezvousHeir is the eligible backend that ranks first for slot s, or
// -1 when none is eligible.
func rendezvousHeir(set *backendSet, s int, eligible func(j int) bool) int {
	heir, best := -1, 0.0
	for h, b := range set.backends {
		if !eligible(h) {
			continue
		}
		if score := rendezvousScore(s, b); heir < 0 || score > best {
			heir, best = h, score
		}
	}
	return heir
}

// rendezvousScore ranks backend b for slot s: weighted rendezvous hashing
// (-weight / ln(u), u a hash of the slot and the backend's address in
// (0, 1)), so that each backend is first for a share of slots in proportion
// to its weight.
func rendezvousScore(s int, b *backend) float64 {
	h := b.slotSeed ^ (uint64(s)+1)*0x9e3779b97f4a7c15
	// splitmix64's finaliser spreads the bits.
	h = (h ^ h>>30) * 0xbf58476d1ce4e5b9
	h = (h ^ h>>27) * 0x94d049bb133111eb
	h ^= h >> 31
	u := (float64(h>>11) + 0.5) / (1 << 53)
	return -float64(b.weight.Load()) / math.Log(u)
}

// weightedTurns is n turns among the backends that include accepts (by
// index), in proportion to their weights and interleaved (smooth weighted
// round robin); nil when none is included.
func weightedTurns(set *backendSet, include func(j int) bool, n int) []int {
	type cand struct{ index, weight, current int }
	cs := make([]cand, 0, len(set.backends))
	total := 0
	for j, b := range set.backends {
		if include(j) {
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

// slotMapKey is a homes map key: frontend index . slot.
func slotMapKey(i, slot int) []byte { return append(u32(uint32(i)), u32(uint32(slot))...) }

// backendsMapKey is a backends map key: frontend index . slot . state of
// the slot's home owner.
func backendsMapKey(i, slot int, state ownerState) []byte {
	return append(slotMapKey(i, slot), u32(uint32(state))...)
}

// backendElement is a backends map entry: frontend i's slot, when its home
// owner is in state, -> backend j's address, port (padded to the 4-byte
// register) and flow label.
func backendElement(i int, set *backendSet, slot int, state ownerState, j int) nftables.SetElement {
	b := set.backends[j]
	val := append(b.key.Addr().AsSlice(), binaryutil.BigEndian.PutUint16(b.key.Port())...)
	val = append(append(val, 0, 0), b.flowLabel[:]...)
	return nftables.SetElement{Key: backendsMapKey(i, slot, state), Val: val}
}

func ownerElement(id uint32, state ownerState) nftables.SetElement {
	return nftables.SetElement{Key: u32(id), Val: u32(uint32(state))}
}

// addOwners adds the owners map's entries.
func (r *kernelRuleset) addOwners(owners ownerTable) {
	for id := 1; id < len(owners.state); id++ {
		r.pending[r.owners] = append(r.pending[r.owners], ownerElement(uint32(id), owners.state[id]))
	}
}

// addPick adds the frontend's slots to the maps and the pick chain's one
// rule: rewrite the flow's destination to the address and port the maps
// give its slot (a counter modulo the slots), and label it for the bind
// chain (see addBase). A slot with no backend has no entry: the lookup
// misses and the flow is not translated, so this host's own stack, which
// has no socket there, answers it with a reset (UDP: port unreachable),
// as the proxy engine does.
func (r *kernelRuleset) addPick(i int, set *backendSet, pick *nftables.Chain, plan *slotPlan) error {
	n := len(plan.homes)
	if n == 0 {
		return nil
	}
	for s := range n {
		r.pending[r.homes] = append(r.pending[r.homes], nftables.SetElement{Key: slotMapKey(i, s), Val: u32(plan.homes[s])})
		for _, state := range []ownerState{ownerUp, ownerDown} {
			if j := plan.entries[state][s]; j >= 0 {
				r.pending[r.backends] = append(r.pending[r.backends], backendElement(i, set, s, state, int(j)))
			}
		}
	}
	r.conn.AddRule(&nftables.Rule{Table: r.table, Chain: pick, Exprs: r.pickExprs(i, set, n)})
	return nil
}

// The 32-bit registers of the pick rule (8 to 11 are the 128-bit register
// 1, where the backend's address, port and flow label land).
const (
	regFrontend = 8  // the frontend index, then the backend's address
	regSlot     = 9  // the slot, then an IPv4 backend's port
	regOwner    = 10 // the slot's home owner, then its state
	regMark     = 20 // the flow's packet mark, restored before the rewrite
)

// clientHashSeed seeds the client-address hash of ClientIP frontends: the
// same on every replica, so that they all send a client to one backend.
const clientHashSeed = 0xebb

// pickExprs are the pick rule's expressions: they put the frontend index
// and the slot in registers, look up the slot's home owner, that owner's
// state, then the backend for the three (its address, port and flow label
// land from register 1 on), rewrite the packet's destination to the
// backend (checksums updated) and label the flow. The slot is a counter
// modulo the slots (round robin), or for ClientIP a hash of the client's
// address modulo the slots: a client keeps its slot, and its slot keeps
// its backend while that is eligible.
//
// The owner and its state pass through the packet mark on their way to
// the next lookup (the mark itself is restored before the rewrite): the
// kernel does not need it, but the nft tool aborts printing a lookup whose
// key is another lookup's result (nft 1.0), and so `nft list ruleset`
// would, for every table. Only a flow's first packet runs the rule.
func (r *kernelRuleset) pickExprs(i int, set *backendSet, n int) []expr.Any {
	exprs := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: regMark},
		&expr.Immediate{Register: regFrontend, Data: u32(uint32(i))},
	}
	if set.cfg.Balancing == ClientIP {
		exprs = append(exprs,
			&expr.Payload{DestRegister: regSlot, Base: expr.PayloadBaseNetworkHeader, Offset: r.fam.saddrOff, Len: r.fam.addrLen},
			&expr.Hash{SourceRegister: regSlot, DestRegister: regSlot, Length: r.fam.addrLen, Modulus: uint32(n), Seed: clientHashSeed, Type: expr.HashTypeJenkins})
	} else {
		exprs = append(exprs, &expr.Numgen{Register: regSlot, Modulus: uint32(n), Type: unix.NFT_NG_INCREMENTAL})
	}
	viaMark := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: regOwner},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: regOwner},
	}
	exprs = append(exprs, &expr.Lookup{SourceRegister: regFrontend, DestRegister: regOwner, IsDestRegSet: true, SetName: r.homes.Name, SetID: r.homes.ID})
	exprs = append(exprs, viaMark...)
	// owners has an entry for every owner homes names (they are written
	// in one transaction), so the mark is never left holding an owner.
	exprs = append(exprs, &expr.Lookup{SourceRegister: regOwner, DestRegister: regOwner, IsDestRegSet: true, SetName: r.owners.Name, SetID: r.owners.ID})
	exprs = append(exprs, viaMark...)
	return append(exprs,
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: regMark},
		&expr.Lookup{SourceRegister: regFrontend, DestRegister: 1, IsDestRegSet: true, SetName: r.backends.Name, SetID: r.backends.ID},
		// The address, with the network header's checksum and the
		// transport's (its pseudo-header has the address), then the
		// port, with the transport's checksum.
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: r.fam.daddrOff, Len: r.fam.addrLen,
			CsumType: r.fam.csumType, CsumOffset: r.fam.csumOff, CsumFlags: unix.NFT_PAYLOAD_L4CSUM_PSEUDOHDR},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: r.fam.portReg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2,
			CsumType: expr.CsumTypeInet, CsumOffset: l4ChecksumOffset(set.cfg.Protocol)},
		&expr.Ct{Key: expr.CtKeyLABELS, SourceRegister: true, Register: r.fam.labelReg},
	)
}

// l4ChecksumOffset is where a transport header keeps its checksum.
func l4ChecksumOffset(p Protocol) uint32 {
	if p == UDP {
		return 6
	}
	return 16
}

// flushPending adds the map entries the rules were built with: homes and
// owners first, so that no lookup of a new rule can miss them.
func (r *kernelRuleset) flushPending() error {
	for _, m := range []*nftables.Set{r.homes, r.owners, r.backends} {
		if err := inChunks(r.pending[m], func(elems []nftables.SetElement) error { return r.conn.SetAddElements(m, elems) }); err != nil {
			return fmt.Errorf("%s map: %w", m.Name, err)
		}
	}
	return nil
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
func changedSlots(gone, added []nftables.SetElement, i int, set *backendSet, was, now *slotPlan) ([]nftables.SetElement, []nftables.SetElement) {
	for _, state := range []ownerState{ownerUp, ownerDown} {
		for s, j := range now.entries[state] {
			old := was.entries[state][s]
			if old == j {
				continue
			}
			if old >= 0 {
				gone = append(gone, nftables.SetElement{Key: backendsMapKey(i, s, state)})
			}
			if j >= 0 {
				added = append(added, backendElement(i, set, s, state, int(j)))
			}
		}
	}
	return gone, added
}

// changedOwners is the owners map entries to delete and add for the
// owners whose state changed.
func changedOwners(was, now ownerTable) (gone, added []nftables.SetElement) {
	for id := 1; id < len(now.state); id++ {
		if was.state[id] != now.state[id] {
			gone = append(gone, nftables.SetElement{Key: u32(uint32(id))})
			added = append(added, ownerElement(uint32(id), now.state[id]))
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
