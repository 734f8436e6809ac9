package service

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

var reportNow = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

// report is a LoadBalancerReport renewed at renewed that lists served.
func report(name string, renewed time.Time, draining bool, served ...string) *v1alpha1.LoadBalancerReport {
	t := metav1.NewMicroTime(renewed)
	return &v1alpha1.LoadBalancerReport{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: v1alpha1.LoadBalancerReportStatus{Replica: name, HostNode: name, RenewTime: &t, HeartbeatSeconds: 10, Draining: draining, Served: served}}
}

// publishingReconciler waits for an LB host, as the installed controller
// does.
func publishingReconciler(t *testing.T, c client.Client) *Reconciler {
	t.Helper()
	ipam, err := NewAllocator([]string{"10.96.255.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	return &Reconciler{Client: c, Recorder: events.NewFakeRecorder(100), Class: lbmodel.ClassL4, IPAM: ipam, Clock: clocktesting.NewFakePassiveClock(reportNow)}
}

func fakeClient(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	return fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).
		WithStatusSubresource(&corev1.Service{}, &v1alpha1.LoadBalancerReport{}).Build()
}

func ingressIPs(svc *corev1.Service) []string {
	var out []string
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		out = append(out, ing.IP)
	}
	return out
}

// An allocated address is published only once an LB host that is not
// draining reports it served: a client that connects the moment the
// status shows it must find it served (issue 50 item 18). Until then the
// Service's condition says why, and carries the address for ebb lb.
func TestAddressPublishedOnceServed(t *testing.T) {
	tests := []struct {
		name    string
		reports []client.Object
		publish bool
	}{
		{name: "no LB host reports", publish: false},
		{name: "a fresh replica serves it", reports: []client.Object{report("lb-1", reportNow.Add(-time.Second), false, "10.96.255.1")}, publish: true},
		{name: "a replica serves others", reports: []client.Object{report("lb-1", reportNow, false, "10.96.255.9")}, publish: false},
		{name: "only a draining replica serves it", reports: []client.Object{report("lb-1", reportNow, true, "10.96.255.1")}, publish: false},
		{name: "only a stale report lists it", reports: []client.Object{report("lb-1", reportNow.Add(-time.Minute), false, "10.96.255.1")}, publish: false},
		{name: "one of two replicas serves it", reports: []client.Object{
			report("lb-1", reportNow, true, "10.96.255.1"), report("lb-2", reportNow, false, "10.96.255.1")}, publish: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fakeClient(t, append(tt.reports, lbSvc("web"))...)
			r := publishingReconciler(t, c)
			res, svc := reconcile(t, r, "web")
			cond := meta.FindStatusCondition(svc.Status.Conditions, lbmodel.ServedCondition)
			if cond == nil {
				t.Fatalf("no %s condition: %+v", lbmodel.ServedCondition, svc.Status)
			}
			if !tt.publish {
				if len(svc.Status.LoadBalancer.Ingress) != 0 {
					t.Fatalf("published %v before an LB host serves it", ingressIPs(svc))
				}
				if cond.Status != metav1.ConditionFalse || cond.Reason != lbmodel.ReasonAwaitingLoadBalancerHosts {
					t.Errorf("condition %+v, want False %s", cond, lbmodel.ReasonAwaitingLoadBalancerHosts)
				}
				if got := lbmodel.Addresses(svc); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("10.96.255.1")}) {
					t.Errorf("ebb lb would serve %v, want the allocated 10.96.255.1", got)
				}
				if res.RequeueAfter == 0 {
					t.Error("an awaiting Service is not looked at again")
				}
				for _, tc := range []struct {
					rep  *v1alpha1.LoadBalancerReport
					wake bool
				}{
					{report("lb-9", reportNow, false, "10.96.255.1"), true},
					{report("lb-9", reportNow, false, "10.96.255.2"), false},
					{report("lb-9", reportNow, true, "10.96.255.1"), false},
				} {
					reqs := r.awaitingServices(context.Background(), tc.rep)
					if woke := len(reqs) == 1 && reqs[0].Name == "web"; woke != tc.wake || len(reqs) > 1 {
						t.Errorf("a report that serves %v (draining %v) wakes %v, want ns/web woken: %v", tc.rep.Status.Served, tc.rep.Status.Draining, reqs, tc.wake)
					}
				}
				return
			}
			if got := ingressIPs(svc); !slices.Equal(got, []string{"10.96.255.1"}) {
				t.Fatalf("status shows %v, want 10.96.255.1", got)
			}
			if cond.Status != metav1.ConditionTrue || cond.Reason != lbmodel.ReasonServed {
				t.Errorf("condition %+v, want True %s", cond, lbmodel.ReasonServed)
			}
		})
	}
}

// The whole life of an awaiting address: kept across a restart (no other
// Service gets it), published when served, kept published when the LB
// host goes away later, and cleared with the condition when the Service
// stops being a LoadBalancer.
func TestAwaitingAddressLifecycle(t *testing.T) {
	c := fakeClient(t, lbSvc("web"))
	_, svc := reconcile(t, publishingReconciler(t, c), "web")
	if len(lbmodel.AwaitingAddresses(svc)) != 1 {
		t.Fatalf("want one awaiting address, got status %+v", svc.Status)
	}

	// A restart: the awaiting address is the Service's still.
	if err := c.Create(context.Background(), lbSvc("other")); err != nil {
		t.Fatal(err)
	}
	r := publishingReconciler(t, c)
	_, other := reconcile(t, r, "other")
	if got := lbmodel.AwaitingAddresses(other); len(got) != 1 || got[0] == lbmodel.AwaitingAddresses(svc)[0] {
		t.Fatalf("after a restart another Service got %v, the address web awaits with", got)
	}

	// Served: published.
	rep := report("lb-1", reportNow, false, "10.96.255.1", "10.96.255.2")
	if err := c.Create(context.Background(), rep); err != nil {
		t.Fatal(err)
	}
	_, svc = reconcile(t, r, "web")
	if got := ingressIPs(svc); !slices.Equal(got, []string{"10.96.255.1"}) {
		t.Fatalf("served, the status shows %v", got)
	}

	// The LB host goes: the address stays published.
	if err := c.Delete(context.Background(), rep); err != nil {
		t.Fatal(err)
	}
	_, svc = reconcile(t, r, "web")
	if got := ingressIPs(svc); !slices.Equal(got, []string{"10.96.255.1"}) {
		t.Fatalf("the LB host gone, the status shows %v, want the address kept", got)
	}

	// No longer a LoadBalancer: status and condition cleared.
	svc.Spec.Type, svc.Spec.LoadBalancerClass = corev1.ServiceTypeClusterIP, nil
	if err := c.Update(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	_, svc = reconcile(t, r, "web")
	if len(svc.Status.LoadBalancer.Ingress) != 0 || meta.FindStatusCondition(svc.Status.Conditions, lbmodel.ServedCondition) != nil {
		t.Fatalf("a ClusterIP Service keeps %+v", svc.Status)
	}
	// other still awaits: its condition stays, and so does its address.
	_, other = reconcile(t, r, "other")
	if len(other.Status.LoadBalancer.Ingress) != 0 || len(lbmodel.AwaitingAddresses(other)) != 1 {
		t.Fatalf("other: %+v", other.Status)
	}
}

// Services published before the condition existed get none at their
// next reconcile: an upgrade writes nothing for them (the condition comes
// with their next change of status).
func TestPublishedServiceGetsNoConditionAtUpgrade(t *testing.T) {
	c := fakeClient(t, lbSvc("old", withStatus("10.96.255.7"), func(s *corev1.Service) {
		s.Annotations = map[string]string{lbmodel.ServedByAnnotation: lbmodel.ClassL4}
		s.Status.LoadBalancer.Ingress = ingressFor(s, []netip.Addr{netip.MustParseAddr("10.96.255.7")})
	}))
	_, svc := reconcile(t, publishingReconciler(t, c), "old")
	if got := ingressIPs(svc); !slices.Equal(got, []string{"10.96.255.7"}) {
		t.Fatalf("status %v, want 10.96.255.7 kept", got)
	}
	if cond := meta.FindStatusCondition(svc.Status.Conditions, lbmodel.ServedCondition); cond != nil {
		t.Errorf("an upgrade wrote %+v on a published Service", cond)
	}
}

// An address freed wakes the Services waiting for one at once, not at
// their retry 30 s later: the pools' status, which also wakes them, may
// have been counted before the release (e2e/service
// TestAddressPoolsDecideWhoGetsWhichAddress waited out the retry).
func TestAFreedAddressWakesTheWaitingServices(t *testing.T) {
	c := fakeClient(t, lbSvc("web"))
	r := publishingReconciler(t, c)
	r.released = make(chan ctrlevent.GenericEvent, 1)
	reconcile(t, r, "web")
	if len(r.released) != 0 {
		t.Fatal("an allocation woke the waiting Services")
	}
	svc := &corev1.Service{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "web"}, svc); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(svc)}); err != nil {
		t.Fatal(err)
	}
	if len(r.released) != 1 {
		t.Fatal("deleting a Service that held an address woke no waiting Service")
	}
}
