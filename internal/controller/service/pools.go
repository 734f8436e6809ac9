package service

import (
	"fmt"
	"math"
	"math/big"
	"net/netip"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// Pool is one source of load-balancer addresses: an AddressPool, or the
// controller's --vip-pool flags.
type Pool struct {
	// Name is the AddressPool's name (FlagPoolName for the flags).
	Name   string
	Ranges []Range
	// AutoAssign: Services that name no pool draw from it.
	AutoAssign bool
	// Services and Namespaces select who may draw from it (nil: anyone).
	Services, Namespaces labels.Selector
}

// FlagPoolName names the pool of the --vip-pool flags.
const FlagPoolName = "--vip-pool"

// Range is an inclusive range of addresses of one family.
type Range struct {
	From, To netip.Addr
}

// ParseRange reads a CIDR (10.96.240.0/24) or an inclusive range
// (10.96.240.10-10.96.240.20). An IPv4 CIDR of /24 or larger leaves out
// its network and broadcast addresses, which some clients and routers
// will not use.
func ParseRange(s string) (Range, error) {
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
	r := Range{From: p.Addr(), To: lastAddr(p)}
	if p.Addr().Is4() && p.Bits() <= 24 {
		r.From, r.To = r.From.Next(), r.To.Prev()
	}
	return r, nil
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
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

func (p Pool) contains(a netip.Addr) bool {
	for _, r := range p.Ranges {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

func (p Pool) hasFamily(ipv6 bool) bool {
	for _, r := range p.Ranges {
		if r.From.Is6() == ipv6 {
			return true
		}
	}
	return false
}

// admits says why h may not draw from p (nil: it may). Asking for the pool
// by name overrides autoAssign, not the selectors.
func (p Pool) admits(h Holder) error {
	if h.Pool == "" && !p.AutoAssign {
		return fmt.Errorf("pool %s is not auto-assigned: name it in the annotation lb.ebb.dev/address-pool", p.Name)
	}
	if p.Services != nil && !p.Services.Matches(labels.Set(h.Labels)) {
		return fmt.Errorf("pool %s takes only Services with labels %s", p.Name, p.Services)
	}
	if p.Namespaces != nil && !p.Namespaces.Matches(labels.Set(h.NamespaceLabels)) {
		return fmt.Errorf("pool %s takes only Services in namespaces with labels %s", p.Name, p.Namespaces)
	}
	return nil
}
