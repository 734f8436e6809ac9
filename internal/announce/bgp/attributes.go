package bgp

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// Attributes are what an AnnouncementPolicy adds to a route: standard
// (RFC 1997) and large (RFC 8092) communities, and a local preference.
// The zero value adds nothing.
type Attributes struct {
	// Communities, sorted, without duplicates.
	Communities []uint32
	// LargeCommunities, sorted, without duplicates.
	LargeCommunities []LargeCommunity
	// LocalPreference, when set, goes to iBGP peers only (RFC 4271
	// keeps it off eBGP sessions; GoBGP leaves it out there).
	LocalPreference *uint32
}

// LargeCommunity is an RFC 8092 community: global administrator (an AS
// number) and two local values.
type LargeCommunity struct {
	ASN, Local1, Local2 uint32
}

func (c LargeCommunity) String() string {
	return fmt.Sprintf("%d:%d:%d", c.ASN, c.Local1, c.Local2)
}

func compareLarge(a, b LargeCommunity) int {
	if a.ASN != b.ASN {
		return cmpUint(a.ASN, b.ASN)
	}
	if a.Local1 != b.Local1 {
		return cmpUint(a.Local1, b.Local1)
	}
	return cmpUint(a.Local2, b.Local2)
}

func cmpUint(a, b uint32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// wellKnownCommunities are the names the AnnouncementPolicy API takes
// (RFC 1997, RFC 3765, RFC 8326, RFC 7999).
var wellKnownCommunities = map[string]uint32{
	"no-export":           0xFFFFFF01,
	"no-advertise":        0xFFFFFF02,
	"no-export-subconfed": 0xFFFFFF03,
	"no-peer":             0xFFFFFF04,
	"graceful-shutdown":   0xFFFF0000,
	"blackhole":           0xFFFF029A,
}

// ParseCommunity reads a standard community: "ASN:VALUE" (each 0 to
// 65535) or a well-known name.
func ParseCommunity(s string) (uint32, error) {
	if v, ok := wellKnownCommunities[s]; ok {
		return v, nil
	}
	hi, lo, ok := strings.Cut(s, ":")
	if !ok {
		return 0, fmt.Errorf("community %q: want ASN:VALUE (as 64512:100) or a well-known name (no-export, no-advertise, no-export-subconfed, no-peer, graceful-shutdown, blackhole)", s)
	}
	a, errA := strconv.ParseUint(hi, 10, 16)
	b, errB := strconv.ParseUint(lo, 10, 16)
	if errA != nil || errB != nil {
		return 0, fmt.Errorf("community %q: both parts must be numbers 0 to 65535", s)
	}
	return uint32(a)<<16 | uint32(b), nil
}

// ParseLargeCommunity reads a large community: "GLOBAL:LOCAL1:LOCAL2",
// each 0 to 4294967295.
func ParseLargeCommunity(s string) (LargeCommunity, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return LargeCommunity{}, fmt.Errorf("large community %q: want GLOBAL:LOCAL1:LOCAL2 (as 4200000000:1:2)", s)
	}
	var v [3]uint32
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return LargeCommunity{}, fmt.Errorf("large community %q: every part must be a number 0 to 4294967295", s)
		}
		v[i] = uint32(n)
	}
	return LargeCommunity{ASN: v[0], Local1: v[1], Local2: v[2]}, nil
}

// Merge adds b's communities to a's and keeps the higher local
// preference: what one route carries when several policies announce it.
func (a Attributes) Merge(b Attributes) Attributes {
	out := Attributes{
		Communities:      slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(a.Communities), b.Communities...)))),
		LargeCommunities: append(slices.Clone(a.LargeCommunities), b.LargeCommunities...),
		LocalPreference:  a.LocalPreference,
	}
	slices.SortFunc(out.LargeCommunities, compareLarge)
	out.LargeCommunities = slices.Compact(out.LargeCommunities)
	if b.LocalPreference != nil && (a.LocalPreference == nil || *b.LocalPreference > *a.LocalPreference) {
		lp := *b.LocalPreference
		out.LocalPreference = &lp
	}
	if len(out.Communities) == 0 {
		out.Communities = nil
	}
	if len(out.LargeCommunities) == 0 {
		out.LargeCommunities = nil
	}
	return out
}

// Equal compares two sets of attributes.
func (a Attributes) Equal(b Attributes) bool {
	lpEqual := (a.LocalPreference == nil) == (b.LocalPreference == nil) &&
		(a.LocalPreference == nil || *a.LocalPreference == *b.LocalPreference)
	return lpEqual && slices.Equal(a.Communities, b.Communities) && slices.Equal(a.LargeCommunities, b.LargeCommunities)
}

// String shows the attributes as a router's configuration would, for
// logs and tests.
func (a Attributes) String() string {
	var parts []string
	for _, c := range a.Communities {
		parts = append(parts, fmt.Sprintf("%d:%d", c>>16, c&0xFFFF))
	}
	for _, c := range a.LargeCommunities {
		parts = append(parts, c.String())
	}
	if a.LocalPreference != nil {
		parts = append(parts, fmt.Sprintf("local-preference %d", *a.LocalPreference))
	}
	return strings.Join(parts, " ")
}

// pathAttributes are the BGP path attributes that carry a.
func (a Attributes) pathAttributes() []bgp.PathAttributeInterface {
	var out []bgp.PathAttributeInterface
	if len(a.Communities) > 0 {
		out = append(out, bgp.NewPathAttributeCommunities(slices.Clone(a.Communities)))
	}
	if len(a.LargeCommunities) > 0 {
		large := make([]*bgp.LargeCommunity, len(a.LargeCommunities))
		for i, c := range a.LargeCommunities {
			large[i] = bgp.NewLargeCommunity(c.ASN, c.Local1, c.Local2)
		}
		out = append(out, bgp.NewPathAttributeLargeCommunities(large))
	}
	if a.LocalPreference != nil {
		out = append(out, bgp.NewPathAttributeLocalPref(*a.LocalPreference))
	}
	return out
}

// Route is an address to announce, the prefix that carries it and the
// attributes the route carries.
type Route struct {
	Addr netip.Addr
	// Prefix is an aggregate that holds Addr (AnnouncementPolicy
	// aggregationLength); the zero Prefix, or one that does not hold
	// Addr, is Addr's host route.
	Prefix netip.Prefix
	Attrs  Attributes
}

// prefix is the route's prefix, masked.
func (r Route) prefix() netip.Prefix {
	a := r.Addr.Unmap()
	if p := r.Prefix.Masked(); p.IsValid() && p.Contains(a) {
		return p
	}
	return netip.PrefixFrom(a, a.BitLen())
}

// Routes are routes of addrs with no attributes.
func Routes(addrs ...netip.Addr) []Route {
	out := make([]Route, len(addrs))
	for i, a := range addrs {
		out[i] = Route{Addr: a}
	}
	return out
}
