package service

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ebbdev/ebb/internal/addrrange"
)

func TestAllocator(t *testing.T) {
	a, err := NewAllocator([]string{"10.96.255.0/30", "fd00:96::/127"})
	if err != nil {
		t.Fatal(err)
	}
	one := Holder{Service: types.NamespacedName{Namespace: "ns", Name: "one"}, Ports: []string{"TCP/80"}}
	two := Holder{Service: types.NamespacedName{Namespace: "ns", Name: "two"}, Ports: []string{"TCP/80"}}
	tests := []struct {
		name string
		do   func() (netip.Addr, error)
		want string
		err  error
	}{
		{"first IPv4 address", func() (netip.Addr, error) { return a.Allocate(one, false) }, "10.96.255.0", nil},
		{"next one", func() (netip.Addr, error) { return a.Allocate(two, false) }, "10.96.255.1", nil},
		{"claim a free one", func() (netip.Addr, error) {
			return netip.MustParseAddr("10.96.255.3"), a.Claim(netip.MustParseAddr("10.96.255.3"), two)
		}, "10.96.255.3", nil},
		{"claim one of another Service", func() (netip.Addr, error) {
			return netip.Addr{}, a.Claim(netip.MustParseAddr("10.96.255.0"), two)
		}, "", ErrAddressTaken},
		{"claim outside the pools", func() (netip.Addr, error) {
			return netip.Addr{}, a.Claim(netip.MustParseAddr("192.0.2.1"), two)
		}, "", ErrOutsidePools},
		{"IPv6", func() (netip.Addr, error) { return a.Allocate(one, true) }, "fd00:96::", nil},
		{"last IPv4 address", func() (netip.Addr, error) { return a.Allocate(one, false) }, "10.96.255.2", nil},
		{"exhausted", func() (netip.Addr, error) { return a.Allocate(two, false) }, "", ErrPoolExhausted},
	}
	for _, tt := range tests {
		got, err := tt.do()
		if !errors.Is(err, tt.err) {
			t.Fatalf("%s: error %v, want %v", tt.name, err, tt.err)
		}
		if tt.want != "" && got.String() != tt.want {
			t.Fatalf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
	a.Release(one.Service)
	if got := a.Owned(one.Service); len(got) != 0 {
		t.Errorf("released Service still owns %v", got)
	}
	if got, err := a.Allocate(two, false); err != nil || got.String() != "10.96.255.0" {
		t.Errorf("after release: %s, %v", got, err)
	}
}

func TestAllocatorSkipsNetworkAndBroadcast(t *testing.T) {
	a, err := NewAllocator([]string{"10.96.255.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := a.Allocate(Holder{Service: types.NamespacedName{Name: "a"}}, false)
	if first.String() != "10.96.255.1" {
		t.Errorf("first address of a /24: %s, want 10.96.255.1", first)
	}
	for i := 0; i < 253; i++ {
		if _, err := a.Allocate(Holder{Service: types.NamespacedName{Name: "b"}}, false); err != nil {
			t.Fatalf("address %d: %v", i+2, err)
		}
	}
	if _, err := a.Allocate(Holder{Service: types.NamespacedName{Name: "c"}}, false); !errors.Is(err, ErrPoolExhausted) {
		t.Errorf("the broadcast address was handed out: %v", err)
	}
	if _, err := a.Allocate(Holder{Service: types.NamespacedName{Name: "c"}}, true); !errors.Is(err, ErrNoPoolOfFamily) {
		t.Errorf("IPv6 without an IPv6 pool: %v", err)
	}
}

func TestNewAllocatorRejectsBadPools(t *testing.T) {
	for _, pools := range [][]string{{"10.96.255.0"}, {"nonsense"}, {"10.96.255.1-10.96.255.9"}} {
		if _, err := NewAllocator(pools); err == nil {
			t.Errorf("pools %q accepted", pools)
		}
	}
}

// Services share an address only when both ask with the same key and their
// ports do not collide.
func TestAllocatorSharing(t *testing.T) {
	a, err := NewAllocator([]string{"10.96.255.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	svc := func(name, key string, ports ...string) Holder {
		return Holder{Service: types.NamespacedName{Namespace: "ns", Name: name}, ShareKey: key, Ports: ports}
	}
	web, _ := a.Allocate(svc("web", "front", "TCP/80"), false)
	tests := []struct {
		name string
		h    Holder
		same bool
	}{
		{"same key, other port: shares", svc("dns", "front", "UDP/53"), true},
		{"same key, colliding port: does not", svc("web2", "front", "TCP/80"), false},
		{"other key: does not", svc("api", "back", "TCP/443"), false},
		{"no key: does not", svc("plain", "", "TCP/8443"), false},
	}
	for _, tt := range tests {
		got, err := a.Allocate(tt.h, false)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if (got == web) != tt.same {
			t.Errorf("%s: got %s, web has %s", tt.name, got, web)
		}
	}
	if err := a.Claim(web, svc("intruder", "front", "TCP/80")); !errors.Is(err, ErrAddressTaken) || !strings.Contains(err.Error(), "port TCP/80") {
		t.Errorf("claiming a shared address on a colliding port: %v", err)
	}
	if err := a.Claim(web, svc("unshared", "", "TCP/9")); !errors.Is(err, ErrAddressTaken) || !strings.Contains(err.Error(), ShareAnnotation) {
		t.Errorf("claiming a shared address without the annotation: %v", err)
	}
	a.Release(types.NamespacedName{Namespace: "ns", Name: "web"})
	if got := a.Owned(types.NamespacedName{Namespace: "ns", Name: "dns"}); len(got) != 1 || got[0] != web {
		t.Errorf("releasing one sharer freed the address of the other: %v", got)
	}
}

// AddressPools decide who draws from them: autoAssign, the pool a Service
// names, its labels and its namespace's; an exhausted pool says so, and a
// refused Service is told why.
func TestAllocatorPools(t *testing.T) {
	a, err := NewAllocator([]string{"10.96.255.0/30"})
	if err != nil {
		t.Fatal(err)
	}
	mustRange := func(s string) addrrange.Range {
		r, err := addrrange.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	team, _ := labels.Parse("team=blue")
	prod, _ := labels.Parse("env=prod")
	a.SetPools([]Pool{
		{Name: "blue", Ranges: []addrrange.Range{mustRange("10.96.250.1-10.96.250.2")}, AutoAssign: true, Services: team},
		{Name: "manual", Ranges: []addrrange.Range{mustRange("10.96.251.0/30")}, AutoAssign: false},
		{Name: "prod", Ranges: []addrrange.Range{mustRange("10.96.252.0/30")}, AutoAssign: true, Namespaces: prod},
	})
	svc := func(name, pool string, lbls, nsLabels map[string]string) Holder {
		return Holder{Service: types.NamespacedName{Namespace: "ns", Name: name}, Pool: pool, Labels: lbls, NamespaceLabels: nsLabels}
	}
	blue := map[string]string{"team": "blue"}
	tests := []struct {
		name    string
		h       Holder
		want    string
		err     error
		message string
	}{
		{"a blue Service draws from blue first (pools by name)", svc("b1", "", blue, nil), "10.96.250.1", nil, ""},
		{"and again", svc("b2", "", blue, nil), "10.96.250.2", nil, ""},
		{"blue exhausted: the next admitting pool", svc("b3", "", blue, nil), "10.96.255.0", nil, ""},
		{"a Service in a prod namespace", svc("p1", "", nil, map[string]string{"env": "prod"}), "10.96.252.0", nil, ""},
		{"any other Service: the flags' pool", svc("o1", "", nil, nil), "10.96.255.1", nil, ""},
		{"naming a manual pool", svc("m1", "manual", nil, nil), "10.96.251.0", nil, ""},
		{"naming an exhausted pool", svc("b4", "blue", blue, nil), "", ErrPoolExhausted, ""},
		{"naming a pool whose selector refuses", svc("x1", "blue", nil, nil), "", ErrNoPool, "pool blue takes only Services with labels team=blue"},
		{"naming a pool that does not exist", svc("x2", "nope", nil, nil), "", ErrNoPool, "no AddressPool of that name"},
	}
	for _, tt := range tests {
		got, err := a.Allocate(tt.h, false)
		if !errors.Is(err, tt.err) || (tt.message != "" && !strings.Contains(fmt.Sprint(err), tt.message)) {
			t.Fatalf("%s: error %v, want %v containing %q", tt.name, err, tt.err, tt.message)
		}
		if tt.want != "" && got.String() != tt.want {
			t.Fatalf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
	// A requested address of a manual pool needs no name; a selector
	// still applies.
	if err := a.Claim(netip.MustParseAddr("10.96.251.1"), svc("m2", "", nil, nil)); err != nil {
		t.Errorf("claiming an address of a manual pool: %v", err)
	}
	if err := a.Claim(netip.MustParseAddr("10.96.252.1"), svc("p2", "", nil, nil)); !errors.Is(err, ErrNoPool) {
		t.Errorf("claiming an address of a pool whose namespace selector refuses: %v", err)
	}
	blueUsed, _ := a.Usage(Pool{Ranges: []addrrange.Range{mustRange("10.96.250.1-10.96.250.2")}})
	if blueUsed != 2 {
		t.Errorf("blue's usage %d, want 2", blueUsed)
	}
	// A pool that goes away leaves its Services their addresses.
	a.SetPools(nil)
	if got := a.Owned(types.NamespacedName{Namespace: "ns", Name: "b1"}); len(got) != 1 {
		t.Errorf("a Service lost its address with its pool: %v", got)
	}
}

// A sharing key is the namespace's (issue 42 item 7): a tenant who guesses
// another namespace's key does not get ports on its address, unless the
// pool allows sharing across namespaces. And a shared address is given
// only to a Service its pool admits (issue 50 item 10): the pool's
// selectors, and the pool the Service names.
func TestSharingStaysInTheNamespaceAndThePool(t *testing.T) {
	mk := func(name string, cross bool, namespaces labels.Selector, cidr string) Pool {
		r, err := addrrange.Parse(cidr)
		if err != nil {
			t.Fatal(err)
		}
		return Pool{Name: name, AutoAssign: true, Ranges: []addrrange.Range{r}, Namespaces: namespaces, CrossNamespaceSharing: cross}
	}
	holder := func(ns, name, pool string, nsLabels map[string]string, port string) Holder {
		return Holder{Service: types.NamespacedName{Namespace: ns, Name: name}, ShareKey: "front", Ports: []string{port}, Pool: pool, NamespaceLabels: nsLabels}
	}
	teamA := map[string]string{"team": "a"}
	tests := []struct {
		name   string
		pools  []Pool
		first  Holder
		second Holder
		share  bool
	}{
		{"same namespace: shares", []Pool{mk("p", false, nil, "10.96.0.0/28")},
			holder("a", "web", "", nil, "TCP/80"), holder("a", "dns", "", nil, "UDP/53"), true},
		{"another namespace, same key: does not", []Pool{mk("p", false, nil, "10.96.0.0/28")},
			holder("a", "web", "", nil, "TCP/80"), holder("b", "dns", "", nil, "UDP/53"), false},
		{"another namespace, pool allows it: shares", []Pool{mk("p", true, nil, "10.96.0.0/28")},
			holder("a", "web", "", nil, "TCP/80"), holder("b", "dns", "", nil, "UDP/53"), true},
		{"the pool's namespace selector refuses the second: does not", []Pool{mk("team-a", true, labels.SelectorFromSet(teamA), "10.96.0.0/28"), mk("open", true, nil, "10.96.1.0/28")},
			holder("a", "web", "team-a", teamA, "TCP/80"), holder("b", "dns", "", nil, "UDP/53"), false},
		{"the second names another pool: does not", []Pool{mk("p", true, nil, "10.96.0.0/28"), mk("q", true, nil, "10.96.1.0/28")},
			holder("a", "web", "p", nil, "TCP/80"), holder("a", "dns", "q", nil, "UDP/53"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := NewAllocator(nil)
			if err != nil {
				t.Fatal(err)
			}
			a.SetPools(tt.pools)
			first, err := a.Allocate(tt.first, false)
			if err != nil {
				t.Fatal(err)
			}
			second, err := a.Allocate(tt.second, false)
			if err != nil && tt.share {
				t.Fatal(err)
			}
			if got := err == nil && second == first; got != tt.share {
				t.Errorf("second got %s (err %v), first has %s; want shared %v", second, err, first, tt.share)
			}
			// Asking for the address by name obeys the same rules.
			a.Release(tt.second.Service)
			err = a.Claim(first, tt.second)
			if (err == nil) != tt.share {
				t.Errorf("claiming %s: %v, want shared %v", first, err, tt.share)
			}
		})
	}
}

// A Service that shares its address keeps it when an edit makes its ports
// collide with another sharer's; the collision is named so that the
// controller can say so (issue 50 item 10).
func TestCollisionsAfterAnEdit(t *testing.T) {
	a, err := NewAllocator([]string{"10.96.255.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	web := Holder{Service: types.NamespacedName{Namespace: "ns", Name: "web"}, ShareKey: "k", Ports: []string{"TCP/80"}}
	dns := Holder{Service: types.NamespacedName{Namespace: "ns", Name: "dns"}, ShareKey: "k", Ports: []string{"UDP/53"}}
	addr, _ := a.Allocate(web, false)
	if got, _ := a.Allocate(dns, false); got != addr {
		t.Fatalf("dns got %s, web %s: want shared", got, addr)
	}
	if c := a.Collisions(addr, dns); len(c) != 0 {
		t.Errorf("before the edit: %v", c)
	}
	dns.Ports = []string{"UDP/53", "TCP/80"}
	c := a.Collisions(addr, dns)
	if len(c) != 1 || !strings.Contains(c[0], "port TCP/80") || !strings.Contains(c[0], "ns/web") {
		t.Errorf("after the edit: %v", c)
	}
}

// Services of two namespaces that asked for one address and shared it
// before sharing became the namespace's keep it: each reconcile claims it
// again, and a refusal would leave both with a Warning every 30 s and a
// status that no longer follows their edits.
func TestSharersAcrossNamespacesBeforeTheUpgradeKeepTheirAddress(t *testing.T) {
	a, err := NewAllocator([]string{"10.96.255.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddr("10.96.255.7")
	one := Holder{Service: types.NamespacedName{Namespace: "a", Name: "web"}, ShareKey: "k", Ports: []string{"TCP/80"}}
	two := Holder{Service: types.NamespacedName{Namespace: "b", Name: "dns"}, ShareKey: "k", Ports: []string{"UDP/53"}}
	// What the controller reads from the Services' status at start.
	a.Record(addr, one)
	a.Record(addr, two)
	for _, h := range []Holder{one, two} {
		if err := a.Claim(addr, h); err != nil {
			t.Errorf("%s claiming the address it holds: %v", h.Service, err)
		}
	}
	three := Holder{Service: types.NamespacedName{Namespace: "c", Name: "new"}, ShareKey: "k", Ports: []string{"TCP/8080"}}
	if err := a.Claim(addr, three); !errors.Is(err, ErrAddressTaken) {
		t.Errorf("a new Service of a third namespace: %v, want refused", err)
	}
}
