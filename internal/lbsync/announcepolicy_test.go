package lbsync

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
)

func TestPlanAnnouncements(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "lb-1", Labels: map[string]string{"rack": "a"}}}
	pools := []lbv1alpha1.AddressPool{
		{ObjectMeta: metav1.ObjectMeta{Name: "public"}, Spec: lbv1alpha1.AddressPoolSpec{Addresses: []string{"10.96.240.0/28"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "office"}, Spec: lbv1alpha1.AddressPoolSpec{Addresses: []string{"10.96.250.10-10.96.250.20", "fd00:96::/120"}}},
	}
	policy := func(name string, pools []string, bgp, l2 bool, ifaces []string, rack string) lbv1alpha1.AnnouncementPolicy {
		p := lbv1alpha1.AnnouncementPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lbv1alpha1.AnnouncementPolicySpec{AddressPools: pools}}
		if bgp {
			p.Spec.BGP = &lbv1alpha1.BGPAnnouncement{}
		}
		if l2 {
			p.Spec.L2 = &lbv1alpha1.L2Announcement{Interfaces: ifaces}
		}
		if rack != "" {
			p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"rack": rack}}
		}
		return p
	}
	public, office, office6, none := netip.MustParseAddr("10.96.240.5"), netip.MustParseAddr("10.96.250.15"), netip.MustParseAddr("fd00:96::7"), netip.MustParseAddr("10.1.1.1")
	type want struct {
		bgp    bool
		l2     bool
		ifaces []string
	}
	tests := []struct {
		name     string
		policies []lbv1alpha1.AnnouncementPolicy
		want     map[netip.Addr]want
		problems []string
	}{
		{
			name: "no policy: everything every way",
			want: map[netip.Addr]want{public: {true, true, nil}, none: {true, true, nil}},
		},
		{
			name:     "public by BGP, office by L2 on eth1 and eth2",
			policies: []lbv1alpha1.AnnouncementPolicy{policy("p", []string{"public"}, true, false, nil, ""), policy("o", []string{"office"}, false, true, []string{"eth2", "eth1"}, "")},
			want:     map[netip.Addr]want{public: {true, false, nil}, office: {false, true, []string{"eth1", "eth2"}}, office6: {false, true, []string{"eth1", "eth2"}}, none: {}},
		},
		{
			name:     "a policy of another rack does not apply here",
			policies: []lbv1alpha1.AnnouncementPolicy{policy("b", nil, true, true, nil, "b"), policy("a", []string{"public"}, false, true, nil, "a")},
			want:     map[netip.Addr]want{public: {false, true, nil}, office: {}},
		},
		{
			name:     "interfaces of two policies add up; one without interfaces allows all",
			policies: []lbv1alpha1.AnnouncementPolicy{policy("x", []string{"office"}, false, true, []string{"eth1"}, ""), policy("y", []string{"office"}, false, true, []string{"eth3"}, ""), policy("z", []string{"public"}, false, true, []string{"eth1"}, ""), policy("zz", nil, false, true, nil, "a")},
			want:     map[netip.Addr]want{office: {false, true, nil}, none: {false, true, nil}},
		},
		{
			name:     "a missing pool is a problem; the policy's other pools still apply",
			policies: []lbv1alpha1.AnnouncementPolicy{policy("p", []string{"gone", "public"}, true, false, nil, "")},
			want:     map[netip.Addr]want{public: {true, false, nil}, office: {}},
			problems: []string{"AnnouncementPolicy p: no AddressPool gone"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, problems := PlanAnnouncements(node, tt.policies, pools)
			for addr, w := range tt.want {
				l2, ifaces := plan.L2(addr)
				if plan.BGP(addr) != w.bgp || l2 != w.l2 || !slices.Equal(ifaces, w.ifaces) {
					t.Errorf("%s: BGP %v, L2 %v on %v; want %v, %v on %v", addr, plan.BGP(addr), l2, ifaces, w.bgp, w.l2, w.ifaces)
				}
			}
			if strings.Join(problems, "|") != strings.Join(tt.problems, "|") {
				t.Errorf("problems %q, want %q", problems, tt.problems)
			}
			var wantIfaces []string
			for _, p := range tt.policies {
				if p.Spec.L2 != nil && (p.Spec.NodeSelector == nil || p.Spec.NodeSelector.MatchLabels["rack"] == "a") {
					wantIfaces = append(wantIfaces, p.Spec.L2.Interfaces...)
				}
			}
			slices.Sort(wantIfaces)
			if got := plan.L2Interfaces(); !slices.Equal(got, slices.Compact(wantIfaces)) {
				t.Errorf("L2 interfaces %v, want %v", got, wantIfaces)
			}
			again, _ := PlanAnnouncements(node, slices.Clone(tt.policies), pools)
			if !plan.Equal(again) {
				t.Error("the same policies made unequal plans")
			}
		})
	}
}

// Where several policies announce an address by BGP from this host, its
// route carries every community of each and the highest local
// preference; policies of other addresses, of L2 only or of other hosts
// add nothing; a community that does not parse is left out and said.
func TestPlanBGPAttributes(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "lb-1", Labels: map[string]string{"rack": "a"}}}
	pools := []lbv1alpha1.AddressPool{
		{ObjectMeta: metav1.ObjectMeta{Name: "public"}, Spec: lbv1alpha1.AddressPoolSpec{Addresses: []string{"10.96.240.0/28"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "office"}, Spec: lbv1alpha1.AddressPoolSpec{Addresses: []string{"10.96.250.0/28"}}},
	}
	lp := func(v int64) *int64 { return &v }
	policy := func(name, pool string, b *lbv1alpha1.BGPAnnouncement, rack string) lbv1alpha1.AnnouncementPolicy {
		p := lbv1alpha1.AnnouncementPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lbv1alpha1.AnnouncementPolicySpec{AddressPools: []string{pool}, BGP: b}}
		if b == nil {
			p.Spec.L2 = &lbv1alpha1.L2Announcement{}
		}
		if rack != "" {
			p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"rack": rack}}
		}
		return p
	}
	policies := []lbv1alpha1.AnnouncementPolicy{
		policy("transit", "public", &lbv1alpha1.BGPAnnouncement{Communities: []string{"64512:100", "no-export"}, LocalPreference: lp(150)}, ""),
		policy("backup", "public", &lbv1alpha1.BGPAnnouncement{Communities: []string{"64512:100", "64512:7", "70000:1"}, LargeCommunities: []string{"4200000000:1:2"}, LocalPreference: lp(300)}, ""),
		policy("other-rack", "public", &lbv1alpha1.BGPAnnouncement{Communities: []string{"1:1"}, LocalPreference: lp(900)}, "b"),
		policy("by-l2", "public", nil, ""),
		policy("office", "office", &lbv1alpha1.BGPAnnouncement{}, ""),
	}
	plan, problems := PlanAnnouncements(node, policies, pools)
	if want := []string{`AnnouncementPolicy backup: community "70000:1": both parts must be numbers 0 to 65535 (left out)`}; !slices.Equal(problems, want) {
		t.Errorf("problems %q, want %q", problems, want)
	}
	for addr, want := range map[string]string{
		"10.96.240.3": "64512:7 64512:100 65535:65281 4200000000:1:2 local-preference 300",
		"10.96.250.3": "",
		"10.1.1.1":    "",
	} {
		if got := plan.BGPRoute(netip.MustParseAddr(addr)).Attrs.String(); got != want {
			t.Errorf("%s's route carries %q, want %q", addr, got, want)
		}
	}
	// A change of attributes alone is a change of plan (ebb lb announces
	// the routes again).
	changed := slices.Clone(policies)
	changed[0].Spec.BGP = &lbv1alpha1.BGPAnnouncement{Communities: []string{"64512:101"}}
	other, _ := PlanAnnouncements(node, changed, pools)
	if plan.Equal(other) {
		t.Error("plans with different communities are equal")
	}
}

// An aggregating policy gives an address the aggregate that holds it
// where the aggregate lies inside one of the policy's pools, and its host
// route where it would reach outside (said once per pool entry); of
// several policies, the most specific aggregate wins.
func TestPlanBGPAggregates(t *testing.T) {
	pools := []lbv1alpha1.AddressPool{
		{ObjectMeta: metav1.ObjectMeta{Name: "public"}, Spec: lbv1alpha1.AddressPoolSpec{Addresses: []string{"10.96.240.0/24", "fd00:96::/112"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "edge"}, Spec: lbv1alpha1.AddressPoolSpec{Addresses: []string{"10.96.250.10-10.96.250.40"}}},
	}
	l := func(v int32) *int32 { return &v }
	policy := func(name string, b *lbv1alpha1.BGPAnnouncement, pools ...string) lbv1alpha1.AnnouncementPolicy {
		return lbv1alpha1.AnnouncementPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lbv1alpha1.AnnouncementPolicySpec{AddressPools: pools, BGP: b}}
	}
	tests := []struct {
		name     string
		policies []lbv1alpha1.AnnouncementPolicy
		want     map[string]string // address -> prefix ("" for the host route)
		problems []string
	}{
		{
			name:     "a /24 pool by /24 and /120",
			policies: []lbv1alpha1.AnnouncementPolicy{policy("agg", &lbv1alpha1.BGPAnnouncement{AggregationLength: l(24), AggregationLengthV6: l(120)}, "public")},
			want:     map[string]string{"10.96.240.1": "10.96.240.0/24", "10.96.240.254": "10.96.240.0/24", "fd00:96::5": "fd00:96::/120", "10.96.250.20": "invalid Prefix"},
		},
		{
			name:     "a range by /28: the inner blocks aggregate, the edges do not",
			policies: []lbv1alpha1.AnnouncementPolicy{policy("agg", &lbv1alpha1.BGPAnnouncement{AggregationLength: l(28)}, "edge")},
			want:     map[string]string{"10.96.250.10": "invalid Prefix", "10.96.250.17": "10.96.250.16/28", "10.96.250.31": "10.96.250.16/28", "10.96.250.32": "invalid Prefix", "10.96.250.40": "invalid Prefix"},
			problems: []string{"AnnouncementPolicy agg: the /28 aggregates of 10.96.250.10-10.96.250.40 would reach outside the policy's pools: addresses whose aggregate does go as host routes"},
		},
		{
			name:     "a /16 aggregate reaches outside a /24 pool",
			policies: []lbv1alpha1.AnnouncementPolicy{policy("wide", &lbv1alpha1.BGPAnnouncement{AggregationLength: l(16)}, "public")},
			want:     map[string]string{"10.96.240.1": "invalid Prefix"},
			problems: []string{"AnnouncementPolicy wide: the /16 aggregates of 10.96.240.0/24 would reach outside the policy's pools: addresses whose aggregate does go as host routes"},
		},
		{
			name: "the most specific of two policies",
			policies: []lbv1alpha1.AnnouncementPolicy{
				policy("a24", &lbv1alpha1.BGPAnnouncement{AggregationLength: l(24)}, "public"),
				policy("b26", &lbv1alpha1.BGPAnnouncement{AggregationLength: l(26)}, "public"),
			},
			want: map[string]string{"10.96.240.70": "10.96.240.64/26"},
		},
		{
			name: "a policy without aggregation beside one with it: host routes",
			policies: []lbv1alpha1.AnnouncementPolicy{
				policy("a24", &lbv1alpha1.BGPAnnouncement{AggregationLength: l(24)}, "public"),
				policy("plain", &lbv1alpha1.BGPAnnouncement{}, "public"),
			},
			want:     map[string]string{"10.96.240.70": "invalid Prefix"},
			problems: []string{"AnnouncementPolicy plain announces addresses of AnnouncementPolicy a24 by BGP without aggregation: those go as host routes"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, problems := PlanAnnouncements(nil, tt.policies, pools)
			if !slices.Equal(problems, tt.problems) {
				t.Errorf("problems %q, want %q", problems, tt.problems)
			}
			for addr, want := range tt.want {
				if got := plan.BGPRoute(netip.MustParseAddr(addr)).Prefix.String(); got != want {
					t.Errorf("%s's route %s, want %s", addr, got, want)
				}
			}
		})
	}
}
