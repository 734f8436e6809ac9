package azurecmd

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/provider/azure"
)

func lbService(name, ip string, mutate ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: ip}}}}}
	for _, m := range mutate {
		m(s)
	}
	return s
}

// Only Services cloud-provider-azure serves are migrated (not ebb's own
// class, not ClusterIP ones); a Service asking for its address already is
// pinned; pinning writes cloud-provider-azure's annotation for the family.
func TestServiceAddressesAndPinning(t *testing.T) {
	kube := fake.NewClientset(
		lbService("web", "20.0.0.1"),
		lbService("db", "10.1.0.5", func(s *corev1.Service) {
			s.Annotations = map[string]string{InternalAnnotation: "true", IPv4Annotation: "10.1.0.5"}
		}),
		lbService("v6", "2001:db8::1", func(s *corev1.Service) { s.Spec.LoadBalancerIP = "2001:db8::1" }),
		lbService("ebb", "192.0.2.10", func(s *corev1.Service) { s.Spec.LoadBalancerClass = ptr.To("ebb.dev/l4") }),
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "internal-only"}},
	)
	ctx := context.Background()
	got, err := serviceAddresses(ctx, kube)
	if err != nil {
		t.Fatal(err)
	}
	want := []azure.ServiceAddress{
		{Namespace: "shop", Name: "db", IP: "10.1.0.5", Internal: true, Pinned: true},
		{Namespace: "shop", Name: "v6", IP: "2001:db8::1", Pinned: true},
		{Namespace: "shop", Name: "web", IP: "20.0.0.1"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("addresses (-want +got):\n%s", diff)
	}
	if err := pin(ctx, kube, want[2]); err != nil {
		t.Fatal(err)
	}
	web, _ := kube.CoreV1().Services("shop").Get(ctx, "web", metav1.GetOptions{})
	if web.Annotations[IPv4Annotation] != "20.0.0.1" {
		t.Errorf("annotations after pinning: %v", web.Annotations)
	}
	if again, _ := serviceAddresses(ctx, kube); !again[2].Pinned {
		t.Error("a pinned Service is not seen as pinned")
	}
}
