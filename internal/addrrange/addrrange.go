// Package addrrange reads the address ranges of load-balancer address
// pools: CIDRs and inclusive ranges of one family.
package addrrange

import (
	"fmt"
	"math"
	"math/big"
	"net/netip"
	"strings"
)

// Range is an inclusive range of addresses of one family.
type Range struct {
	From, To netip.Addr
}

// Parse reads a CIDR (10.96.240.0/24) or an inclusive range
// (10.96.240.10-10.96.240.20). An IPv4 CIDR of /24 or larger leaves out
// its network and broadcast addresses, which some clients and routers
// will not use.
func Parse(s string) (Range, error) {
	s = strings.TrimSpace(s)
	if from, to, ok := strings.Cut(s, "-"); ok {
		a, errA := netip.ParseAddr(strings.TrimSpace(from))
		b, errB := netip.ParseAddr(strings.TrimSpace(to))
		if errA != nil || errB != nil || a.Is4() != b.Is4() || b.Less(a) {
			return Range{}, fmt.Errorf("%q is not a range of one family from the lower address to the higher, like 10.96.240.10-10.96.240.20", s)
		}
		return Range{From: a.Unmap(), To: b.Unmap()}, nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return Range{}, fmt.Errorf("%q is not a CIDR like 10.96.255.0/24 or fd00:96::/112, nor a range like 10.96.240.10-10.96.240.20", s)
	}
	p = p.Masked()
	r := Range{From: p.Addr(), To: Last(p)}
	if p.Addr().Is4() && p.Bits() <= 24 {
		r.From, r.To = r.From.Next(), r.To.Prev()
	}
	return r, nil
}

// Last is the last address of p (its broadcast address, for IPv4).
func Last(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Contains reports whether a lies in the range.
func (r Range) Contains(a netip.Addr) bool {
	return a.Is4() == r.From.Is4() && !a.Less(r.From) && !r.To.Less(a)
}

// Size is the number of addresses, capped at the largest int64.
func (r Range) Size() int64 {
	n := new(big.Int).Sub(new(big.Int).SetBytes(r.To.AsSlice()), new(big.Int).SetBytes(r.From.AsSlice()))
	n.Add(n, big.NewInt(1))
	if !n.IsInt64() {
		return math.MaxInt64
	}
	return n.Int64()
}
