package announcestatus

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

func TestPolicyStatus(t *testing.T) {
	pools := []lbv1alpha1.AddressPool{{ObjectMeta: metav1.ObjectMeta{Name: "office"}, Spec: lbv1alpha1.AddressPoolSpec{Addresses: []string{"10.96.250.0/28"}}}}
	report := func(host string, owned ...string) v1alpha1.LoadBalancerReport {
		return v1alpha1.LoadBalancerReport{Status: v1alpha1.LoadBalancerReportStatus{HostNode: host, Announcement: &v1alpha1.Announcement{L2Owned: owned}}}
	}
	nodes := map[string]labels.Set{"lb-1": {"rack": "a"}, "lb-2": {"rack": "a"}, "lb-3": {"rack": "b"}}
	reports := []v1alpha1.LoadBalancerReport{report("lb-1", "10.96.250.9", "10.96.240.1"), report("lb-2", "10.96.250.10"), report("lb-3", "10.96.250.2")}
	tests := []struct {
		name       string
		spec       lbv1alpha1.AnnouncementPolicySpec
		wantBy     string
		wantHosts  int32
		wantOwners string
		wantReason string
		wantMsg    string
	}{
		{
			name:   "L2 for one pool on rack a: owners of the pool's addresses on those hosts, in address order",
			spec:   lbv1alpha1.AnnouncementPolicySpec{AddressPools: []string{"office"}, L2: &lbv1alpha1.L2Announcement{}, NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "a"}}},
			wantBy: "L2", wantHosts: 2, wantOwners: "[{10.96.250.9 lb-1} {10.96.250.10 lb-2}]",
			wantReason: lbv1alpha1.ReasonAnnouncing, wantMsg: "announced by L2 from 2 LB hosts",
		},
		{
			name:   "BGP and L2 for every address",
			spec:   lbv1alpha1.AnnouncementPolicySpec{BGP: &lbv1alpha1.BGPAnnouncement{}, L2: &lbv1alpha1.L2Announcement{}},
			wantBy: "BGP+L2", wantHosts: 3, wantOwners: "[{10.96.240.1 lb-1} {10.96.250.2 lb-3} {10.96.250.9 lb-1} {10.96.250.10 lb-2}]",
			wantReason: lbv1alpha1.ReasonAnnouncing,
		},
		{
			name:   "BGP only: no L2 owners",
			spec:   lbv1alpha1.AnnouncementPolicySpec{BGP: &lbv1alpha1.BGPAnnouncement{}, AddressPools: []string{"office"}},
			wantBy: "BGP", wantHosts: 3, wantOwners: "[]", wantReason: lbv1alpha1.ReasonAnnouncing,
		},
		{
			name:   "a missing pool",
			spec:   lbv1alpha1.AnnouncementPolicySpec{BGP: &lbv1alpha1.BGPAnnouncement{}, AddressPools: []string{"office", "gone"}},
			wantBy: "BGP", wantHosts: 3, wantOwners: "[]", wantReason: lbv1alpha1.ReasonPoolNotFound, wantMsg: "no AddressPool gone",
		},
		{
			name:   "no host chosen",
			spec:   lbv1alpha1.AnnouncementPolicySpec{L2: &lbv1alpha1.L2Announcement{}, NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "z"}}},
			wantBy: "L2", wantOwners: "[]", wantReason: lbv1alpha1.ReasonNoHosts,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &lbv1alpha1.AnnouncementPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Generation: 2}, Spec: tt.spec}
			st := PolicyStatus(p, pools, reports, nodes)
			if st.AnnouncedBy != tt.wantBy || st.Hosts != tt.wantHosts || fmt.Sprint(st.L2Owners) != tt.wantOwners {
				t.Errorf("by %q hosts %d owners %v; want %q %d %s", st.AnnouncedBy, st.Hosts, st.L2Owners, tt.wantBy, tt.wantHosts, tt.wantOwners)
			}
			c := meta.FindStatusCondition(st.Conditions, lbv1alpha1.ReadyCondition)
			if c == nil || c.Reason != tt.wantReason || !strings.Contains(c.Message, tt.wantMsg) || (c.Status == metav1.ConditionTrue) != (tt.wantReason == lbv1alpha1.ReasonAnnouncing) {
				t.Errorf("Ready = %+v, want reason %s with %q", c, tt.wantReason, tt.wantMsg)
			}
		})
	}
}
