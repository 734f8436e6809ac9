package lbsync

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/internal/announce/bgp"
)

func TestSelectBGPPeers(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "lb-1", Labels: map[string]string{"rack": "a"}}}
	secrets := map[string]*corev1.Secret{
		"good":  {Data: map[string][]byte{"password": []byte("s3cret")}},
		"nokey": {Data: map[string][]byte{"pw": []byte("x")}},
	}
	secret := func(name string) (*corev1.Secret, error) {
		if s, ok := secrets[name]; ok {
			return s, nil
		}
		return nil, errors.New("not found")
	}
	peer := func(name, addr string, mutate func(*lbv1alpha1.BGPPeerSpec)) lbv1alpha1.BGPPeer {
		p := lbv1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lbv1alpha1.BGPPeerSpec{PeerAddress: addr, PeerASN: 64500, MyASN: 64512}}
		if mutate != nil {
			mutate(&p.Spec)
		}
		return p
	}
	rack := func(r string) func(*lbv1alpha1.BGPPeerSpec) {
		return func(s *lbv1alpha1.BGPPeerSpec) {
			s.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"rack": r}}
		}
	}
	r1, r2 := netip.MustParseAddr("10.0.0.253"), netip.MustParseAddr("10.0.0.254")
	tests := []struct {
		name         string
		node         *corev1.Node
		objs         []lbv1alpha1.BGPPeer
		want         []bgp.Peer
		wantProblems []string // substrings, in address order
	}{
		{
			name: "no selector chooses every host; settings carried over",
			node: node,
			objs: []lbv1alpha1.BGPPeer{peer("r", "10.0.0.253", func(s *lbv1alpha1.BGPPeerSpec) {
				s.PeerPort = 1179
				s.HoldTime = &metav1.Duration{Duration: 9 * time.Second}
				s.KeepaliveTime = &metav1.Duration{Duration: 3 * time.Second}
				s.GracefulRestart = new(bool)
				s.PasswordSecretRef = &lbv1alpha1.SecretReference{Name: "good"}
			})},
			want: []bgp.Peer{{Address: r1, ASN: 64500, LocalASN: 64512, Port: 1179, HoldTime: 9 * time.Second, KeepaliveTime: 3 * time.Second, Password: "s3cret", NoGracefulRestart: true}},
		},
		{
			name: "selectors choose by the node's labels, sorted by address",
			node: node,
			objs: []lbv1alpha1.BGPPeer{peer("b", "10.0.0.254", rack("a")), peer("a", "10.0.0.253", nil), peer("c", "10.0.0.9", rack("b"))},
			want: []bgp.Peer{{Address: r1, ASN: 64500, LocalASN: 64512}, {Address: r2, ASN: 64500, LocalASN: 64512}},
		},
		{
			name: "an unknown node is chosen only by peers without a selector",
			objs: []lbv1alpha1.BGPPeer{peer("b", "10.0.0.254", rack("a")), peer("a", "10.0.0.253", nil)},
			want: []bgp.Peer{{Address: r1, ASN: 64500, LocalASN: 64512}},
		},
		{
			name:         "password Secret missing or without the key",
			node:         node,
			objs:         []lbv1alpha1.BGPPeer{peer("a", "10.0.0.253", func(s *lbv1alpha1.BGPPeerSpec) { s.PasswordSecretRef = &lbv1alpha1.SecretReference{Name: "gone"} }), peer("b", "10.0.0.254", func(s *lbv1alpha1.BGPPeerSpec) { s.PasswordSecretRef = &lbv1alpha1.SecretReference{Name: "nokey"} })},
			wantProblems: []string{"reading the password Secret ebb-system/gone", `has no key "password"`},
		},
		{
			name:         "two peers with one address: the first by name wins",
			node:         node,
			objs:         []lbv1alpha1.BGPPeer{peer("z", "10.0.0.253", nil), peer("a", "10.0.0.253", func(s *lbv1alpha1.BGPPeerSpec) { s.PeerASN = 64501 })},
			want:         []bgp.Peer{{Address: r1, ASN: 64501, LocalASN: 64512}},
			wantProblems: []string{"BGPPeer z: BGPPeer a already peers with 10.0.0.253"},
		},
		{
			name: "an invalid selector is a problem, not a crash",
			node: node,
			objs: []lbv1alpha1.BGPPeer{peer("a", "10.0.0.253", func(s *lbv1alpha1.BGPPeerSpec) {
				s.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "rack", Operator: "Near"}}}
			})},
			wantProblems: []string{"invalid nodeSelector"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, problems := SelectBGPPeers(tt.node, tt.objs, "ebb-system", secret)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("peers = %+v, want %+v", got, tt.want)
			}
			if len(problems) != len(tt.wantProblems) {
				t.Fatalf("problems = %+v, want %d", problems, len(tt.wantProblems))
			}
			for i, p := range problems {
				if !strings.Contains(p.Message, tt.wantProblems[i]) {
					t.Errorf("problem %d = %q, want %q in it", i, p.Message, tt.wantProblems[i])
				}
			}
		})
	}
}
