package announcestatus

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

func TestPeerStatus(t *testing.T) {
	report := func(host string, draining bool, sessions ...v1alpha1.BGPSession) v1alpha1.LoadBalancerReport {
		r := v1alpha1.LoadBalancerReport{Status: v1alpha1.LoadBalancerReportStatus{HostNode: host, Draining: draining}}
		if sessions != nil {
			r.Status.Announcement = &v1alpha1.Announcement{BGPPeers: sessions}
		}
		return r
	}
	est := v1alpha1.BGPSession{Address: "10.0.0.253", State: "established"}
	active := v1alpha1.BGPSession{Address: "10.0.0.253", State: "active"}
	other := v1alpha1.BGPSession{Address: "10.0.0.9", State: "established"}
	nodes := map[string]labels.Set{"lb-1": {"rack": "a"}, "lb-2": {"rack": "a"}, "lb-3": {"rack": "b"}}
	tests := []struct {
		name            string
		selector        *metav1.LabelSelector
		reports         []v1alpha1.LoadBalancerReport
		wantSessions    string // node=state, comma-separated
		wantEstablished int32
		wantCondition   metav1.ConditionStatus
		wantReason      string
		wantMessage     string
	}{
		{
			name:         "every host established",
			reports:      []v1alpha1.LoadBalancerReport{report("lb-2", false, est), report("lb-1", false, other, est)},
			wantSessions: "lb-1=established,lb-2=established", wantEstablished: 2,
			wantCondition: metav1.ConditionTrue, wantReason: lbv1alpha1.ReasonAllEstablished, wantMessage: "all 2 sessions established",
		},
		{
			name:          "a host without the session yet, one active, one that cannot peer",
			reports:       []v1alpha1.LoadBalancerReport{report("lb-1", false, active), report("lb-2", false, other), report("lb-3", false, v1alpha1.BGPSession{Address: "10.0.0.253", State: "error", Message: "no Secret"})},
			wantSessions:  "lb-1=active,lb-2=configuring,lb-3=error",
			wantCondition: metav1.ConditionFalse, wantReason: lbv1alpha1.ReasonSessionsDown,
			wantMessage: "3 of 3 sessions not established: lb-1: active; lb-2: configuring; lb-3: error (no Secret)",
		},
		{
			name:         "the selector chooses by node labels",
			selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "b"}},
			reports:      []v1alpha1.LoadBalancerReport{report("lb-1", false, active), report("lb-3", false, est)},
			wantSessions: "lb-3=established", wantEstablished: 1,
			wantCondition: metav1.ConditionTrue, wantReason: lbv1alpha1.ReasonAllEstablished,
		},
		{
			name:         "a host with two replicas (a hand-off) shows its best session",
			reports:      []v1alpha1.LoadBalancerReport{report("lb-1", true), report("lb-1", false, est)},
			wantSessions: "lb-1=established", wantEstablished: 1,
			wantCondition: metav1.ConditionTrue, wantReason: lbv1alpha1.ReasonAllEstablished,
		},
		{
			name:          "no host chosen",
			selector:      &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "z"}},
			reports:       []v1alpha1.LoadBalancerReport{report("lb-1", false, est)},
			wantCondition: metav1.ConditionFalse, wantReason: lbv1alpha1.ReasonNoHosts,
		},
		{
			name:          "an invalid selector",
			selector:      &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "rack", Operator: "Near"}}},
			reports:       []v1alpha1.LoadBalancerReport{report("lb-1", false, est)},
			wantCondition: metav1.ConditionFalse, wantReason: lbv1alpha1.ReasonInvalidSelector, wantMessage: "spec.nodeSelector",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			peer := &lbv1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "r", Generation: 4},
				Spec: lbv1alpha1.BGPPeerSpec{PeerAddress: "10.0.0.253", PeerASN: 64500, MyASN: 64512, NodeSelector: tt.selector}}
			st := PeerStatus(peer, tt.reports, nodes)
			var got []string
			for _, s := range st.Sessions {
				got = append(got, s.Node+"="+s.State)
			}
			if strings.Join(got, ",") != tt.wantSessions {
				t.Errorf("sessions = %v, want %s", got, tt.wantSessions)
			}
			if st.Established != tt.wantEstablished || st.Selected != int32(len(got)) || st.ObservedGeneration != 4 {
				t.Errorf("established %d of %d (generation %d), want %d of %d (4)", st.Established, st.Selected, st.ObservedGeneration, tt.wantEstablished, len(got))
			}
			c := meta.FindStatusCondition(st.Conditions, lbv1alpha1.EstablishedCondition)
			if c == nil || c.Status != tt.wantCondition || c.Reason != tt.wantReason || !strings.Contains(c.Message, tt.wantMessage) {
				t.Errorf("condition = %+v, want %s %s %q", c, tt.wantCondition, tt.wantReason, tt.wantMessage)
			}
		})
	}
}
