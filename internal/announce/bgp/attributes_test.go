package bgp

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
)

func TestParseCommunity(t *testing.T) {
	tests := []struct {
		in      string
		want    uint32
		wantErr string
	}{
		{in: "64512:100", want: 64512<<16 | 100},
		{in: "0:0", want: 0},
		{in: "65535:65535", want: 0xFFFFFFFF},
		{in: "no-export", want: 0xFFFFFF01},
		{in: "graceful-shutdown", want: 0xFFFF0000},
		{in: "blackhole", want: 0xFFFF029A},
		{in: "65536:1", wantErr: "0 to 65535"},
		{in: "1:-1", wantErr: "0 to 65535"},
		{in: "64512", wantErr: "want ASN:VALUE"},
		{in: "no-such-name", wantErr: "want ASN:VALUE"},
		{in: "1:2:3", wantErr: "0 to 65535"},
	}
	for _, tt := range tests {
		got, err := ParseCommunity(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseCommunity(%q) = %d, %v; want an error with %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseCommunity(%q) = %#x, %v; want %#x", tt.in, got, err, tt.want)
		}
	}
}

func TestParseLargeCommunity(t *testing.T) {
	tests := []struct {
		in      string
		want    LargeCommunity
		wantErr string
	}{
		{in: "4200000000:1:2", want: LargeCommunity{4200000000, 1, 2}},
		{in: "0:0:0", want: LargeCommunity{}},
		{in: "4294967295:4294967295:4294967295", want: LargeCommunity{4294967295, 4294967295, 4294967295}},
		{in: "4294967296:1:2", wantErr: "0 to 4294967295"},
		{in: "1:2", wantErr: "want GLOBAL:LOCAL1:LOCAL2"},
		{in: "a:b:c", wantErr: "0 to 4294967295"},
	}
	for _, tt := range tests {
		got, err := ParseLargeCommunity(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseLargeCommunity(%q) = %v, %v; want an error with %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseLargeCommunity(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestAttributesMerge(t *testing.T) {
	lp := func(v uint32) *uint32 { return &v }
	a := Attributes{Communities: []uint32{3, 1}, LargeCommunities: []LargeCommunity{{2, 0, 0}}, LocalPreference: lp(100)}
	b := Attributes{Communities: []uint32{1, 2}, LargeCommunities: []LargeCommunity{{1, 5, 5}, {2, 0, 0}}, LocalPreference: lp(200)}
	got := a.Merge(b)
	want := Attributes{Communities: []uint32{1, 2, 3}, LargeCommunities: []LargeCommunity{{1, 5, 5}, {2, 0, 0}}, LocalPreference: lp(200)}
	if !got.Equal(want) {
		t.Errorf("merged %v, want %v", got, want)
	}
	if got := b.Merge(a); !got.Equal(want) {
		t.Errorf("merged the other way %v, want %v", got, want)
	}
	if got := (Attributes{}).Merge(Attributes{}); !got.Equal(Attributes{}) || got.Communities != nil || got.LocalPreference != nil {
		t.Errorf("nothing merged with nothing: %#v", got)
	}
	// Merge must not write into its inputs' slices.
	if a.Communities[0] != 3 || *a.LocalPreference != 100 {
		t.Errorf("Merge changed its receiver: %v", a)
	}
	if s := want.String(); s != "0:1 0:2 0:3 1:5:5 2:0:0 local-preference 200" {
		t.Errorf("String() = %q", s)
	}
}

// routeAttributes reads, from the router's table, the attributes of
// prefix's route (ok false: no route).
func routeAttributes(t *testing.T, r *server.BgpServer, prefix netip.Prefix) (attrs Attributes, ok bool) {
	t.Helper()
	err := r.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: bgp.RF_IPv4_UC}, func(nlri bgp.NLRI, paths []*apiutil.Path) {
		if nlri.String() != prefix.String() || len(paths) == 0 {
			return
		}
		ok = true
		for _, a := range paths[0].Attrs {
			switch a := a.(type) {
			case *bgp.PathAttributeCommunities:
				attrs.Communities = a.Value
			case *bgp.PathAttributeLargeCommunities:
				for _, c := range a.Values {
					attrs.LargeCommunities = append(attrs.LargeCommunities, LargeCommunity{c.ASN, c.LocalData1, c.LocalData2})
				}
			case *bgp.PathAttributeLocalPref:
				v := a.Value
				attrs.LocalPreference = &v
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return attrs, ok
}

// A route carries its policy's communities and local preference to the
// router; new attributes replace the route without a withdrawal between;
// the local preference reaches an iBGP router only (RFC 4271).
func TestSpeakerCarriesCommunitiesAndLocalPreference(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the test router listens on port 179 (make test runs as root)")
	}
	lp := func(v uint32) *uint32 { return &v }
	vip := netip.MustParseAddr("10.96.240.9")
	prefix := netip.PrefixFrom(vip, 32)
	first := Attributes{Communities: []uint32{64512<<16 | 100, 0xFFFFFF01}, LargeCommunities: []LargeCommunity{{4200000000, 1, 2}}, LocalPreference: lp(200)}
	second := Attributes{Communities: []uint32{64512<<16 | 200}, LocalPreference: lp(50)}
	for _, tt := range []struct {
		name string
		asn  uint32
		// sent: whether the local preference reaches the router.
		sent bool
	}{{"eBGP", 64512, false}, {"iBGP", 64500, true}} {
		t.Run(tt.name, func(t *testing.T) {
			router := startRouterFor(t, "", tt.asn)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var withdrawals atomic.Int32
			err := router.WatchEvent(ctx, server.WatchEventMessageCallbacks{OnPathUpdate: func(paths []*apiutil.Path, _ time.Time) {
				for _, p := range paths {
					if p.Withdrawal && p.Nlri.String() == prefix.String() {
						withdrawals.Add(1)
					}
				}
			}}, server.WatchUpdate(false, "", ""))
			if err != nil {
				t.Fatal(err)
			}
			sp, err := Start(ctx, slog.New(slog.DiscardHandler), Config{ASN: tt.asn, RouterID: netip.MustParseAddr("10.0.0.1"),
				Peers: []Peer{{Address: netip.MustParseAddr(routerAddr), ASN: 64500, HoldTime: 3 * time.Second}}})
			if err != nil {
				t.Fatal(err)
			}
			defer sp.Stop()
			for _, want := range []Attributes{first, second, {}} {
				if err := sp.Sync([]Route{{Addr: vip, Attrs: want}}); err != nil {
					t.Fatal(err)
				}
				if !tt.sent {
					want.LocalPreference = nil
				} else if want.LocalPreference == nil {
					want.LocalPreference = lp(100) // GoBGP's default on iBGP
				}
				deadline := time.Now().Add(20 * time.Second)
				for {
					got, ok := routeAttributes(t, router, prefix)
					if ok && got.Equal(want) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("the router's route of %s carries %q (present %v), want %q", vip, got, ok, want)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			if n := withdrawals.Load(); n != 0 {
				t.Errorf("the route was withdrawn %d times while its attributes changed", n)
			}
		})
	}
}

// Addresses that share an aggregate share one route, which carries the
// attributes of all of them and stays while any of them is wanted; each
// address counts as announced.
func TestSpeakerAggregatesRoutes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the test router listens on port 179 (make test runs as root)")
	}
	router := startRouter(t, "")
	sp, err := Start(context.Background(), slog.New(slog.DiscardHandler), Config{ASN: 64512, RouterID: netip.MustParseAddr("10.0.0.1"),
		Peers: []Peer{{Address: netip.MustParseAddr(routerAddr), ASN: 64500, HoldTime: 3 * time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Stop()
	a, b, c := netip.MustParseAddr("10.96.240.1"), netip.MustParseAddr("10.96.240.9"), netip.MustParseAddr("10.96.240.20")
	agg := netip.MustParsePrefix("10.96.240.0/28")
	nextHop := netip.MustParseAddr("10.0.0.1")
	route := func(addr netip.Addr, p netip.Prefix, communities ...uint32) Route {
		return Route{Addr: addr, Prefix: p, Attrs: Attributes{Communities: communities}}
	}
	steps := []struct {
		name       string
		want       []Route
		routes     map[netip.Prefix]netip.Addr
		attrs      string
		announced  []netip.Addr
		routeCount int
	}{
		{"two addresses in the /28, one outside as a host route",
			[]Route{route(a, agg, 1), route(b, netip.MustParsePrefix("10.96.240.9/28"), 2), route(c, netip.Prefix{})},
			map[netip.Prefix]netip.Addr{agg: nextHop, netip.MustParsePrefix("10.96.240.20/32"): nextHop}, "0:1 0:2", []netip.Addr{a, b, c}, 2},
		{"one of them left: the aggregate stays, with its attributes",
			[]Route{route(b, agg, 2)},
			map[netip.Prefix]netip.Addr{agg: nextHop}, "0:2", []netip.Addr{b}, 1},
		{"a prefix that does not hold the address is its host route",
			[]Route{route(c, agg)},
			map[netip.Prefix]netip.Addr{netip.MustParsePrefix("10.96.240.20/32"): nextHop}, "", []netip.Addr{c}, 1},
	}
	for _, step := range steps {
		if err := sp.Sync(step.want); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		waitForRoutes(t, router, bgp.RF_IPv4_UC, step.routes)
		if step.attrs != "" {
			if got, _ := routeAttributes(t, router, agg); got.String() != step.attrs {
				t.Errorf("%s: the aggregate carries %q, want %q", step.name, got, step.attrs)
			}
		}
		if got := sp.Announced(); !slices.Equal(got, step.announced) {
			t.Errorf("%s: announced %v, want %v", step.name, got, step.announced)
		}
		if got := sp.AnnouncedRoutes(); got != step.routeCount {
			t.Errorf("%s: %d routes, want %d", step.name, got, step.routeCount)
		}
	}
}
