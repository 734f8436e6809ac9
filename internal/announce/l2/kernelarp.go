package l2

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/ebbdev/ebb/internal/nftstate"
)

// DefaultKernelTable names the nftables table (family arp) that keeps the
// kernel out of the announcement.
const DefaultKernelTable = "ebb-l2"

// The arp family's hooks (linux/netfilter_arp.h).
const (
	arpHookIn  nftables.ChainHook = 0
	arpHookOut nftables.ChainHook = 1
)

// Offsets in an Ethernet/IPv4 ARP packet.
const (
	arpOperation = 6
	arpSenderIP  = 14
	arpTargetIP  = 24
)

// kernelARP keeps the kernel from announcing the load-balancer addresses
// itself. Every host serving an address has a local route for it, and
// Linux (arp_ignore=0, the default) answers an ARP request for any local
// address on any interface: every replica's kernel would answer for every
// address, not only its owner's. And when a host sends from such an
// address, Linux (arp_announce=0) puts the address in its own ARP
// requests, which makes every neighbour on the segment point the address
// at that host. Two rules undo both, with no sysctl to change on the
// host: requests for the addresses are dropped on the way in (the owner
// answers them from user space: packet sockets see a frame before the
// arp hooks do), and on the way out an ARP packet from one of the
// addresses gets the interface's own address as its sender instead.
// IPv6 needs neither: Linux answers neighbour solicitations only for
// addresses configured on the interface, and picks such an address as the
// source of its own.
type kernelARP struct {
	table string
	netns int
	// ifaces are the interfaces whose outgoing ARP is rewritten, each with
	// its own IPv4 address.
	ifaces []ifaceAddr
	last   []netip.Addr
	synced bool
}

type ifaceAddr struct {
	index int
	addr  netip.Addr
}

func (k *kernelARP) conn() (*nftables.Conn, error) { return nftstate.Conn(k.netns) }

// sync installs the rules for the IPv4 addresses of addrs in one
// transaction.
func (k *kernelARP) sync(addrs []netip.Addr) error {
	var v4 []netip.Addr
	for _, a := range addrs {
		if a.Is4() {
			v4 = append(v4, a)
		}
	}
	if k.synced && slices.Equal(v4, k.last) {
		return nil
	}
	c, err := k.conn()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	defer c.CloseLasting()
	t := c.AddTable(&nftables.Table{Name: k.table, Family: nftables.TableFamilyARP})
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookRef(arpHookIn), Priority: nftables.ChainPriorityFilter})
	out := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookRef(arpHookOut), Priority: nftables.ChainPriorityFilter})
	set := &nftables.Set{Name: "addresses", Table: t, KeyType: nftables.TypeIPAddr}
	if err := c.AddSet(set, nil); err != nil {
		return fmt.Errorf("adding the addresses set: %w", err)
	}
	c.FlushSet(set)
	var elems []nftables.SetElement
	for _, a := range v4 {
		elems = append(elems, nftables.SetElement{Key: a.AsSlice()})
	}
	if len(elems) > 0 {
		if err := c.SetAddElements(set, elems); err != nil {
			return fmt.Errorf("adding the addresses: %w", err)
		}
	}
	c.FlushChain(in)
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: []expr.Any{
		// arp operation request
		&expr.Payload{Base: expr.PayloadBaseNetworkHeader, Offset: arpOperation, Len: 2, DestRegister: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 1}},
		// arp daddr ip @addresses
		&expr.Payload{Base: expr.PayloadBaseNetworkHeader, Offset: arpTargetIP, Len: 4, DestRegister: 1},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	c.FlushChain(out)
	for _, ifa := range k.ifaces {
		c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: []expr.Any{
			// meta oif <interface>
			&expr.Meta{Key: expr.MetaKeyOIF, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(uint32(ifa.index))},
			// arp saddr ip @addresses
			&expr.Payload{Base: expr.PayloadBaseNetworkHeader, Offset: arpSenderIP, Len: 4, DestRegister: 1},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
			// arp saddr ip set <the interface's address>
			&expr.Immediate{Register: 1, Data: ifa.addr.AsSlice()},
			&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: 1, Base: expr.PayloadBaseNetworkHeader,
				Offset: arpSenderIP, Len: 4, CsumType: expr.CsumTypeNone},
		}})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing nftables table arp %s: %w", k.table, err)
	}
	k.last, k.synced = v4, true
	return nil
}

// repair writes the table again if it is not as sync left it (a firewall
// reload ran `nft flush ruleset`, which leaves every LB host answering ARP
// for every address), and reports whether it had to.
func (k *kernelARP) repair() (bool, error) {
	if !k.synced {
		return false, nil
	}
	ok, err := k.intact()
	if err != nil || ok {
		return false, err
	}
	k.synced = false
	if err := k.sync(k.last); err != nil {
		return true, fmt.Errorf("repairing nftables table arp %s: %w", k.table, err)
	}
	return true, nil
}

// intact reports whether the table has its rules and its addresses.
func (k *kernelARP) intact() (bool, error) {
	c, err := k.conn()
	if err != nil {
		return false, fmt.Errorf("opening nftables: %w", err)
	}
	defer c.CloseLasting()
	t := &nftables.Table{Name: k.table, Family: nftables.TableFamilyARP}
	for chain, want := range map[string]int{"input": 1, "output": len(k.ifaces)} {
		if n, err := nftstate.Rules(c, t, chain); err != nil || n != want {
			return false, err
		}
	}
	n, err := nftstate.Elements(c, &nftables.Set{Name: "addresses", Table: t, KeyType: nftables.TypeIPAddr})
	return err == nil && n == len(k.last), err
}

// remove deletes the table, if it is there.
func (k *kernelARP) remove() error {
	c, err := k.conn()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	defer c.CloseLasting()
	c.DelTable(&nftables.Table{Name: k.table, Family: nftables.TableFamilyARP})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing nftables table arp %s: %w", k.table, err)
	}
	k.synced = false
	return nil
}
