package service

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/internal/eventstest"
)

func pool(name string, auto bool, addrs ...string) *lbv1alpha1.AddressPool {
	return &lbv1alpha1.AddressPool{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1},
		Spec: lbv1alpha1.AddressPoolSpec{Addresses: addrs, AutoAssign: ptr.To(auto)}}
}

func reconcilePool(t *testing.T, r *PoolReconciler, name string) *lbv1alpha1.AddressPool {
	t.Helper()
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: name}}); err != nil {
		t.Fatal(err)
	}
	p := &lbv1alpha1.AddressPool{}
	if err := r.Client.Get(context.Background(), types.NamespacedName{Name: name}, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// A Service that names a pool gets its address from it; the pool's status
// counts it; the pool's last address taken, it is Exhausted, and a Service
// asking for it is told why; a pool whose spec cannot be read says so and
// hands out nothing.
func TestAddressPoolsAndTheirStatus(t *testing.T) {
	blue := pool("blue", false, "10.96.250.1-10.96.250.2")
	broken := pool("broken", true, "10.96.251.0")
	named := func(pool string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Annotations = map[string]string{lbv1alpha1.PoolAnnotation: pool} }
	}
	r, rec := newReconciler(t, blue, broken, lbSvc("a", named("blue")), lbSvc("b", named("blue")), lbSvc("c", named("blue")), lbSvc("d", named("broken")))
	pr := &PoolReconciler{Client: r.Client, IPAM: r.IPAM}

	if _, svc := reconcile(t, r, "a"); len(svc.Status.LoadBalancer.Ingress) != 1 || svc.Status.LoadBalancer.Ingress[0].IP != "10.96.250.1" {
		t.Fatalf("a Service naming pool blue got %+v", svc.Status.LoadBalancer.Ingress)
	}
	got := reconcilePool(t, pr, "blue")
	if got.Status.AssignedIPv4 != 1 || got.Status.AvailableIPv4 != 1 || !meta.IsStatusConditionTrue(got.Status.Conditions, lbv1alpha1.ReadyCondition) ||
		!meta.IsStatusConditionFalse(got.Status.Conditions, lbv1alpha1.ExhaustedCondition) {
		t.Fatalf("blue's status after one Service: %+v", got.Status)
	}
	reconcile(t, r, "b")
	got = reconcilePool(t, pr, "blue")
	if got.Status.AvailableIPv4 != 0 || !meta.IsStatusConditionTrue(got.Status.Conditions, lbv1alpha1.ExhaustedCondition) {
		t.Fatalf("blue's status when full: %+v", got.Status)
	}
	eventstest.Recorded(rec)
	if _, svc := reconcile(t, r, "c"); len(svc.Status.LoadBalancer.Ingress) != 0 {
		t.Fatalf("a third Service got %+v from a pool of two", svc.Status.LoadBalancer.Ingress)
	}
	if evs := eventstest.Recorded(rec); len(evs) != 1 || !strings.Contains(evs[0], "every address of the pools is in use") {
		t.Fatalf("events for the third Service: %q", evs)
	}

	got = reconcilePool(t, pr, "broken")
	c := meta.FindStatusCondition(got.Status.Conditions, lbv1alpha1.ReadyCondition)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != lbv1alpha1.ReasonInvalidAddresses || !strings.Contains(c.Message, "10.96.251.0") {
		t.Fatalf("a pool with an invalid address: %+v", got.Status)
	}
	if _, svc := reconcile(t, r, "d"); len(svc.Status.LoadBalancer.Ingress) != 0 {
		t.Fatalf("a Service naming the broken pool got %+v", svc.Status.LoadBalancer.Ingress)
	}
	if evs := eventstest.Recorded(rec); len(evs) != 1 || !strings.Contains(evs[0], "there is no AddressPool of that name that can be read") {
		t.Fatalf("events for the Service naming the broken pool: %q", evs)
	}
}
