package lbmodel

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestAddresses(t *testing.T) {
	v4, v6 := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("2001:db8::10")
	awaiting := func(c metav1.Condition) []metav1.Condition { return []metav1.Condition{c} }
	tests := []struct {
		name   string
		status corev1.ServiceStatus
		want   []netip.Addr
	}{
		{name: "nothing", want: nil},
		{name: "published", status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "203.0.113.10"}, {Hostname: "lb.example.com"}}}},
			want: []netip.Addr{v4}},
		{name: "awaiting both families", status: corev1.ServiceStatus{Conditions: awaiting(AwaitingCondition([]netip.Addr{v4, v6}, 1))}, want: []netip.Addr{v4, v6}},
		{name: "one published, one awaiting, each once", status: corev1.ServiceStatus{
			LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "203.0.113.10"}}},
			Conditions:   awaiting(AwaitingCondition([]netip.Addr{v6, v4}, 1))}, want: []netip.Addr{v4, v6}},
		{name: "served condition carries none", status: corev1.ServiceStatus{Conditions: awaiting(ServedConditionTrue(1))}, want: nil},
		{name: "someone else's message", status: corev1.ServiceStatus{Conditions: awaiting(metav1.Condition{Type: ServedCondition, Status: metav1.ConditionFalse,
			Reason: ReasonAwaitingLoadBalancerHosts, Message: "203.0.113.10"})}, want: nil},
		{name: "a bad address in the list spoils the list", status: corev1.ServiceStatus{Conditions: awaiting(metav1.Condition{Type: ServedCondition, Status: metav1.ConditionFalse,
			Reason: ReasonAwaitingLoadBalancerHosts, Message: awaitingPrefix + "203.0.113.10, nonsense" + awaitingSuffix})}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &corev1.Service{Status: tt.status}
			if got := Addresses(svc); !slices.Equal(got, tt.want) {
				t.Errorf("Addresses = %v, want %v", got, tt.want)
			}
		})
	}
}

// ebb lb serves an awaiting address: the controller publishes it only
// once it is served.
func TestFrontendsOfAnAwaitingAddress(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec:   corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}}},
		Status: corev1.ServiceStatus{Conditions: []metav1.Condition{AwaitingCondition([]netip.Addr{netip.MustParseAddr("203.0.113.10")}, 1)}}}
	fes, err := Frontends(svc, nil, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(fes) != 1 || fes[0].Address != "203.0.113.10" || fes[0].Port != 80 {
		t.Fatalf("frontends %+v, want one on 203.0.113.10:80", fes)
	}
}
