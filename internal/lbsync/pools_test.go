package lbsync

import (
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/internal/addrrange"
	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// ebb lb serves only addresses of the pools (issue 42 item 7): an address
// written into a Service's status that no AddressPool holds is refused,
// and said so, while the Service's other addresses and other Services are
// served. Before the pools are known, every address is served.
func TestOnlyThePoolsAddressesAreServed(t *testing.T) {
	svc := func(name string, ips ...string) *corev1.Service {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(lbmodel.ClassL4),
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}}},
		}
		for _, ip := range ips {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		}
		return s
	}
	objs := []any{svc("good", "10.96.240.1"), svc("forged", "192.0.2.53", "10.96.240.2")}
	pools := []lbv1alpha1.AddressPool{{Spec: lbv1alpha1.AddressPoolSpec{Addresses: []string{"10.96.240.0/28", "not-a-range"}}}}
	flag, err := addrrange.Parse("fd00:96::/112")
	if err != nil {
		t.Fatal(err)
	}
	addresses := func(cfg dataplane.Config) []string {
		var out []string
		for _, fe := range cfg.Frontends {
			out = append(out, fe.Address)
		}
		return out
	}

	s := &Syncer{Class: lbmodel.ClassL4, modes: map[string]lbmodel.BackendMode{}, last: map[string][]dataplane.Frontend{}, transitions: map[string]transition{}}
	svcs, slices, nodes := replicaView(t, objs)
	cfg, _, refused := s.desired(logr.Discard(), svcs, slices, nodes)
	if got := addresses(cfg); len(got) != 3 || len(refused) != 0 {
		t.Fatalf("pools not known yet: served %v, refused %v; want every address", got, refused)
	}

	s.SetPools(poolRangesOf(pools, []addrrange.Range{flag}))
	cfg, owners, refused := s.desired(logr.Discard(), svcs, slices, nodes)
	if got := strings.Join(addresses(cfg), ","); got != "10.96.240.2,10.96.240.1" && got != "10.96.240.1,10.96.240.2" {
		t.Errorf("served %s, want 10.96.240.1 and 10.96.240.2", got)
	}
	if len(refused) != 1 || refused[0].Reason != SkipOutsidePools || !strings.Contains(refused[0].Err.Error(), "192.0.2.53 lies in no AddressPool") {
		t.Fatalf("refused %v, want the frontend at 192.0.2.53", refused)
	}
	if owners[refused[0].Name].Name != "forged" {
		t.Errorf("the refused frontend is not said on its Service: owners %v", owners)
	}
}
