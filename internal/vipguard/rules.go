package vipguard

import (
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// family is what differs between the IPv4 and the IPv6 half of the table.
type family struct {
	nfproto byte
	// daddrOff and addrLen locate the destination address in the network
	// header; protoReg and portReg are the 32-bit registers after an
	// address loaded into register 1 (NFT_REG32_00 and on), where a
	// concatenated key's next fields go.
	daddrOff, addrLen uint32
	protoReg, portReg uint32
	addrType          nftables.SetDatatype
	// addresses are the guarded addresses; ports the frontends.
	addresses, ports *nftables.Set
}

// guardSets are the table's four sets, by family.
type guardSets struct {
	v4, v6 family
}

func newSets(t *nftables.Table) guardSets {
	ports4, _ := nftables.ConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)
	ports6, _ := nftables.ConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeInetService)
	// The IDs name the sets within a transaction that also creates them.
	return guardSets{
		v4: family{nfproto: unix.NFPROTO_IPV4, daddrOff: 16, addrLen: 4, protoReg: 9, portReg: 10, addrType: nftables.TypeIPAddr,
			addresses: &nftables.Set{Table: t, Name: "addresses4", ID: 1, KeyType: nftables.TypeIPAddr},
			ports:     &nftables.Set{Table: t, Name: "ports4", ID: 2, KeyType: ports4, Concatenation: true}},
		v6: family{nfproto: unix.NFPROTO_IPV6, daddrOff: 24, addrLen: 16, protoReg: 12, portReg: 13, addrType: nftables.TypeIP6Addr,
			addresses: &nftables.Set{Table: t, Name: "addresses6", ID: 3, KeyType: nftables.TypeIP6Addr},
			ports:     &nftables.Set{Table: t, Name: "ports6", ID: 4, KeyType: ports6, Concatenation: true}},
	}
}

func (s guardSets) all() []*nftables.Set {
	return []*nftables.Set{s.v4.addresses, s.v4.ports, s.v6.addresses, s.v6.ports}
}

func (s guardSets) family(a netip.Addr) family {
	if a.Is4() {
		return s.v4
	}
	return s.v6
}

// elements are the sets' elements for st (every set present, empty or not).
func (s guardSets) elements(st State) map[*nftables.Set][]nftables.SetElement {
	out := map[*nftables.Set][]nftables.SetElement{}
	for _, set := range s.all() {
		out[set] = nil
	}
	for _, a := range st.Addresses {
		f := s.family(a)
		out[f.addresses] = append(out[f.addresses], nftables.SetElement{Key: a.AsSlice()})
	}
	for _, p := range st.Ports {
		f := s.family(p.Addr)
		out[f.ports] = append(out[f.ports], nftables.SetElement{Key: portKey(p)})
	}
	return out
}

// portKey is a concatenated key: the address, then the protocol and the
// port each in a 32-bit register of its own (zero-padded), as the kernel
// lays out `daddr . l4proto . dport`.
func portKey(p Port) []byte {
	key := p.Addr.AsSlice()
	key = append(key, p.Protocol, 0, 0, 0)
	return append(key, append(binaryutil.BigEndian.PutUint16(p.Port), 0, 0)...)
}

// rules are the chain's rules for st, in order (see the package comment).
func (s guardSets) rules(st State) [][]expr.Any {
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	drop := &expr.Verdict{Kind: expr.VerdictDrop}
	rules := [][]expr.Any{
		{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("lo")},
			accept,
		},
		// ip frag-off & 0x1fff != 0: a later fragment has no ports; its
		// first fragment, which has them, was checked (with connection
		// tracking on, fragments are reassembled before this hook).
		{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 6, Len: 2},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 2, Mask: []byte{0x1f, 0xff}, Xor: []byte{0, 0}},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0}},
			accept,
		},
		// exthdr frag frag-off != 0: the same for IPv6.
		{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV6}},
			&expr.Exthdr{Op: expr.ExthdrOpIpv6, Type: unix.IPPROTO_FRAGMENT, Offset: 2, Len: 2, DestRegister: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 2, Mask: []byte{0xff, 0xf8}, Xor: []byte{0, 0}},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0}},
			accept,
		},
		append(s.v4.matchPort(), accept),
		append(s.v6.matchPort(), accept),
		// socket wildcard 0: the packet belongs to an established
		// connection of this very address (one of a frontend just
		// removed, draining), never to a listener on every address
		// (sshd's 0.0.0.0:22). (A listener bound to the address itself
		// is not found by this lookup: frontends pass by the ports set.)
		{
			&expr.Socket{Key: expr.SocketKeyWildcard, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0}},
			accept,
		},
	}
	if st.Tracked {
		// ct state established,related: the kernel engine's flows of a
		// frontend just removed, which drain in conntrack.
		rules = append(rules, []expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
			accept,
		})
	}
	return append(rules,
		[]expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMP}},
			accept,
		},
		[]expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
			accept,
		},
		append(s.v4.matchAddress(), &expr.Counter{}, drop),
		append(s.v6.matchAddress(), &expr.Counter{}, drop),
	)
}

// matchPort: the family's packets whose destination, protocol and port
// are in the ports set.
func (f family) matchPort() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.nfproto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.daddrOff, Len: f.addrLen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: f.protoReg},
		&expr.Payload{DestRegister: f.portReg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: f.ports.Name, SetID: f.ports.ID},
	}
}

// matchAddress: the family's packets to a guarded address.
func (f family) matchAddress() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.nfproto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.daddrOff, Len: f.addrLen},
		&expr.Lookup{SourceRegister: 1, SetName: f.addresses.Name, SetID: f.addresses.ID},
	}
}

// ifname is an interface name as the kernel compares it: zero-padded to
// IFNAMSIZ.
func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}
