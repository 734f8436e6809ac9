package lbmodel

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/dataplane"
)

func ready(n *corev1.Node) {
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue})
}

func createdAt(minute int) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.CreationTimestamp = metav1.NewTime(time.Date(2026, 11, 27, 0, minute, 0, 0, time.UTC))
	}
}

// Two Nodes that give one InternalIP (a reinstalled machine whose old
// Node lingers, edge nodes behind one NAT) cost one backend, never the
// Service: every frontend stays valid for the data plane, with one backend
// for the address, the preferred node's (issue 50 item 4).
func TestNodesSharingAnAddressCostOneBackend(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []*corev1.Node
		want  []dataplane.Backend
		dups  []DuplicateAddress
	}{
		{"the Ready node is kept over a lingering old one",
			[]*corev1.Node{node("old", "10.0.0.1", createdAt(9)), node("new", "10.0.0.1", ready, createdAt(1)), node("n2", "10.0.0.2", ready)},
			[]dataplane.Backend{be("10.0.0.1", 30080, "new", none), be("10.0.0.2", 30080, "n2", none)},
			[]DuplicateAddress{{Address: netip.MustParseAddr("10.0.0.1"), Kept: "new", Dropped: []string{"old"}}}},
		{"of two Ready ones, the newer",
			[]*corev1.Node{node("a", "10.0.0.1", ready, createdAt(1)), node("b", "10.0.0.1", ready, createdAt(2))},
			[]dataplane.Backend{be("10.0.0.1", 30080, "b", none)},
			[]DuplicateAddress{{Address: netip.MustParseAddr("10.0.0.1"), Kept: "b", Dropped: []string{"a"}}}},
		{"an IPv4-mapped IPv6 address is the same address",
			[]*corev1.Node{node("a", "10.0.0.1", ready), node("b", "::ffff:10.0.0.1")},
			[]dataplane.Backend{be("10.0.0.1", 30080, "a", none)},
			[]DuplicateAddress{{Address: netip.MustParseAddr("10.0.0.1"), Kept: "a", Dropped: []string{"b"}}}},
		{"an excluded node shares with nobody",
			[]*corev1.Node{node("a", "10.0.0.1"), node("b", "10.0.0.1", func(n *corev1.Node) { n.Labels = map[string]string{ExcludeNodeLabel: ""} })},
			[]dataplane.Backend{be("10.0.0.1", 30080, "a", none)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := service(func(s *corev1.Service) { s.Name = "other" })
			for _, svc := range []*corev1.Service{service(), other} {
				fes, err := Frontends(svc, nil, tc.nodes, Options{})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := (dataplane.Config{Frontends: fes}).Validate(); err != nil {
					t.Fatalf("Service %s is not served: %v", svc.Name, err)
				}
				if got := fes[0].Backends; !reflect.DeepEqual(got, tc.want) {
					t.Errorf("Service %s: backends %v, want %v", svc.Name, got, tc.want)
				}
			}
			if got := DuplicateNodeAddresses(tc.nodes); !reflect.DeepEqual(got, tc.dups) {
				t.Errorf("duplicates %v, want %v", fmt.Sprint(got), fmt.Sprint(tc.dups))
			}
		})
	}
}

// Source ranges as Kubernetes reads them (issue 50 item 12): the field, or
// the cloud providers' annotation when the field is empty (a Service that
// relied on it was open to everyone); leading zeros, which an API server
// before 1.36 stored, parse as they did then; every range is written in
// canonical form; one that does not parse is kept, so that the data plane
// refuses that Service's frontend (fails closed) and no other.
func TestSourceRangesAsKubernetesReadsThem(t *testing.T) {
	const annotation = corev1.AnnotationLoadBalancerSourceRangesKey
	for _, tc := range []struct {
		name       string
		field      []string
		annotation string
		want       []string
		served     bool
	}{
		{"the field", []string{" 192.0.2.0/24 "}, "", []string{"192.0.2.0/24"}, true},
		{"the annotation when the field is empty", nil, "192.0.2.0/24, 198.51.100.0/24", []string{"192.0.2.0/24", "198.51.100.0/24"}, true},
		{"the field wins over the annotation", []string{"192.0.2.0/24"}, "0.0.0.0/0", []string{"192.0.2.0/24"}, true},
		{"leading zeros, stored by an older API server", []string{"010.000.001.000/24"}, "", []string{"10.0.1.0/24"}, true},
		{"host bits set", []string{"192.0.2.7/24", "2001:db8::1/32"}, "", []string{"192.0.2.0/24", "2001:db8::/32"}, true},
		{"a range that does not parse: that Service only is refused", []string{"192.0.2.0/24", "everyone"}, "", []string{"192.0.2.0/24", "everyone"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := service(func(s *corev1.Service) {
				s.Spec.LoadBalancerSourceRanges = tc.field
				if tc.annotation != "" {
					s.Annotations = map[string]string{annotation: tc.annotation}
				}
			})
			fes, err := Frontends(svc, nil, []*corev1.Node{node("n1", "10.0.0.1")}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(fes[0].SourceRanges, tc.want) {
				t.Errorf("source ranges %q, want %q", fes[0].SourceRanges, tc.want)
			}
			other, _ := Frontends(service(func(s *corev1.Service) { s.Name = "other" }), nil, []*corev1.Node{node("n1", "10.0.0.1")}, Options{})
			_, err = (dataplane.Config{Frontends: fes}).Validate()
			if (err == nil) != tc.served {
				t.Errorf("the data plane takes the frontend: %v, want %v", err, tc.served)
			}
			if _, err := (dataplane.Config{Frontends: other}).Validate(); err != nil {
				t.Errorf("another Service is refused: %v", err)
			}
		})
	}
}

// Endpoint and node addresses in the forms the API server accepts are
// read as the data plane keys them: an IPv4-mapped address is its IPv4
// address (before, beside its IPv4 form it made two backends, and the data
// plane refused the whole frontend as "listed twice"), and leading zeros
// from objects stored before Kubernetes 1.36 are read, not dropped.
func TestOddAddressFormsAreOneBackendEach(t *testing.T) {
	svc := service(func(s *corev1.Service) { s.Annotations = map[string]string{BackendModeAnnotation: string(PodMode)} })
	sl := slice(discoveryv1.AddressTypeIPv4, 8080,
		ep{ip: "10.0.0.21", node: "node-1"}, ep{ip: "::ffff:10.0.0.21", node: "node-1"}, ep{ip: "010.000.000.022", node: "node-2"})
	fes, err := Frontends(svc, []*discoveryv1.EndpointSlice{sl}, nil, Options{})
	if err != nil || len(fes) != 1 {
		t.Fatalf("frontends %v, %v", fes, err)
	}
	if _, err := (dataplane.Config{Frontends: fes}).Validate(); err != nil {
		t.Fatalf("the data plane refuses the frontend: %v", err)
	}
	var got []string
	for _, b := range fes[0].Backends {
		got = append(got, b.AddrPort().String())
	}
	if want := []string{"10.0.0.21:8080", "10.0.0.22:8080"}; !reflect.DeepEqual(got, want) {
		t.Errorf("backends %v, want %v", got, want)
	}

	nodeMode := service()
	nodes := []*corev1.Node{node("node-1", "010.0.0.11"), node("node-2", "::ffff:10.0.0.12")}
	fes, _ = Frontends(nodeMode, nil, nodes, Options{})
	got = nil
	for _, b := range fes[0].Backends {
		got = append(got, b.AddrPort().String())
	}
	if want := []string{"10.0.0.11:30080", "10.0.0.12:30080"}; !reflect.DeepEqual(got, want) {
		t.Errorf("node backends %v, want %v", got, want)
	}
}
