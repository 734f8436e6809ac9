package service

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/eventstest"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

func lbSvc(name string, mutate ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(lbmodel.ClassL4),
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, m := range mutate {
		m(s)
	}
	return s
}

func withStatus(ip string) func(*corev1.Service) {
	return func(s *corev1.Service) {
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}}
		s.Finalizers = []string{lbmodel.CleanupFinalizer}
	}
}

func newReconciler(t *testing.T, objs ...client.Object) (*Reconciler, *events.FakeRecorder) {
	t.Helper()
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).WithStatusSubresource(&corev1.Service{}, &lbv1alpha1.AddressPool{}).Build()
	ipam, err := NewAllocator([]string{"10.96.255.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	rec := events.NewFakeRecorder(20)
	// Published at once: these tests are about the allocation;
	// publish_test.go is about waiting for an LB host.
	return &Reconciler{Client: c, Recorder: rec, Class: lbmodel.ClassL4, IPAM: ipam, PublishAtOnce: true}, rec
}

// testScheme has Kubernetes' types and the AddressPools.
func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := lbv1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func reconcile(t *testing.T, r *Reconciler, name string) (ctrl.Result, *corev1.Service) {
	t.Helper()
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}})
	if err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{}
	if err := r.Client.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name}, svc); err != nil {
		t.Fatal(err)
	}
	return res, svc
}

// After a restart, the addresses in the Services' status are claimed
// before anything is allocated, so a new Service never gets one of them.
func TestAllocationsSurviveRestart(t *testing.T) {
	r, _ := newReconciler(t,
		lbSvc("old-a", withStatus("10.96.255.1")),
		lbSvc("old-b", withStatus("10.96.255.2")),
		lbSvc("new"),
	)
	_, svc := reconcile(t, r, "new")
	if got := svc.Status.LoadBalancer.Ingress; len(got) != 1 || got[0].IP != "10.96.255.3" {
		t.Fatalf("new Service got %+v, want 10.96.255.3 (.1 and .2 are taken)", got)
	}
	_, old := reconcile(t, r, "old-a")
	if got := old.Status.LoadBalancer.Ingress; len(got) != 1 || got[0].IP != "10.96.255.1" {
		t.Errorf("an existing Service's address changed: %+v", got)
	}
}

// A Service ebb cannot give an address gets a Warning, no address, and
// the False condition lb.ebb.dev/AddressAssigned saying why, written once
// however often the retry comes.
func TestBadRequestsGetAWarningAndAFalseCondition(t *testing.T) {
	tests := []struct {
		name      string
		svc       *corev1.Service
		wantEvent string
		requeue   bool
	}{{
		name:      "address outside every pool",
		svc:       lbSvc("outside", func(s *corev1.Service) { s.Annotations = map[string]string{RequestedIPsAnnotation: "192.0.2.10"} }),
		wantEvent: "outside every pool", requeue: true,
	}, {
		name:      "address taken",
		svc:       lbSvc("taken", func(s *corev1.Service) { s.Spec.LoadBalancerIP = "10.96.255.1" }),
		wantEvent: "is used by ns/holder", requeue: true,
	}, {
		name:      "not an address",
		svc:       lbSvc("typo", func(s *corev1.Service) { s.Annotations = map[string]string{RequestedIPsAnnotation: "10.96.255.x"} }),
		wantEvent: `requested address "10.96.255.x" is not an IP address`, requeue: true,
	}, {
		name:      "SCTP",
		svc:       lbSvc("sctp", func(s *corev1.Service) { s.Spec.Ports[0].Protocol = corev1.ProtocolSCTP }),
		wantEvent: "change them to TCP or UDP",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, rec := newReconciler(t, lbSvc("holder", withStatus("10.96.255.1")), tt.svc)
			res, svc := reconcile(t, r, tt.svc.Name)
			if len(svc.Status.LoadBalancer.Ingress) != 0 {
				t.Errorf("status written: %+v", svc.Status.LoadBalancer)
			}
			evs := eventstest.Recorded(rec)
			if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning SyncLoadBalancerFailed") || !strings.Contains(evs[0], tt.wantEvent) {
				t.Errorf("events %q, want one Warning SyncLoadBalancerFailed containing %q", evs, tt.wantEvent)
			}
			if (res.RequeueAfter > 0) != tt.requeue {
				t.Errorf("requeue after %s, want a retry: %v", res.RequeueAfter, tt.requeue)
			}
			reason := ReasonAllocationFailed
			if !tt.requeue {
				reason = ReasonUnsupportedPort
			}
			c := meta.FindStatusCondition(svc.Status.Conditions, AddressAssignedCondition)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != reason || !strings.Contains(c.Message, tt.wantEvent) {
				t.Errorf("condition %+v, want False %s saying %q", c, reason, tt.wantEvent)
			}
			_, again := reconcile(t, r, tt.svc.Name)
			if again.ResourceVersion != svc.ResourceVersion {
				t.Errorf("the retry wrote the Service again (resourceVersion %s, then %s)", svc.ResourceVersion, again.ResourceVersion)
			}
		})
	}
}

// A Service given its addresses has the True condition naming them; one
// that failed first turns True once it gets them; a Service published
// before ebb wrote the condition gets no write of its own for it.
func TestAddressAssignedCondition(t *testing.T) {
	r, _ := newReconciler(t,
		lbSvc("web"),
		lbSvc("late", func(s *corev1.Service) { s.Annotations = map[string]string{RequestedIPsAnnotation: "10.96.255.9"} }),
		lbSvc("blocker", withStatus("10.96.255.9")),
	)
	_, web := reconcile(t, r, "web")
	c := meta.FindStatusCondition(web.Status.Conditions, AddressAssignedCondition)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonAddressAssigned || c.Message != "assigned "+web.Status.LoadBalancer.Ingress[0].IP {
		t.Errorf("web's condition %+v, want True naming %+v", c, web.Status.LoadBalancer.Ingress)
	}
	// As an earlier version left it: published, without the conditions.
	web.Status.Conditions = nil
	if err := r.Client.Status().Update(context.Background(), web); err != nil {
		t.Fatal(err)
	}
	_, again := reconcile(t, r, "web")
	if again.ResourceVersion != web.ResourceVersion || len(again.Status.Conditions) != 0 {
		t.Errorf("a Service published before the conditions existed got a write for them: %+v", again.Status.Conditions)
	}
	_, blocker := reconcile(t, r, "blocker")
	_, late := reconcile(t, r, "late")
	if c := meta.FindStatusCondition(late.Status.Conditions, AddressAssignedCondition); c == nil || c.Reason != ReasonAllocationFailed {
		t.Fatalf("late's condition %+v, want AllocationFailed", c)
	}
	if err := r.Client.Delete(context.Background(), blocker); err != nil {
		t.Fatal(err)
	}
	r.IPAM.Release(holderOf(blocker, nil).Service)
	_, late = reconcile(t, r, "late")
	if c := meta.FindStatusCondition(late.Status.Conditions, AddressAssignedCondition); c == nil || c.Status != metav1.ConditionTrue || c.Message != "assigned 10.96.255.9" {
		t.Errorf("late's condition %+v once the address was free, want True", c)
	}
}

func TestOtherClassesAndClasslessServices(t *testing.T) {
	other := lbSvc("other", func(s *corev1.Service) { s.Spec.LoadBalancerClass = ptr.To("example.com/lb") })
	classless := lbSvc("classless", func(s *corev1.Service) { s.Spec.LoadBalancerClass = nil })
	r, rec := newReconciler(t, other, classless)
	for _, name := range []string{"other", "classless"} {
		_, svc := reconcile(t, r, name)
		if len(svc.Finalizers) != 0 || len(svc.Status.LoadBalancer.Ingress) != 0 {
			t.Errorf("%s was touched: %+v %+v", name, svc.Finalizers, svc.Status)
		}
	}
	if evs := eventstest.Recorded(rec); len(evs) != 0 {
		t.Errorf("events about Services of other classes: %q", evs)
	}
	r.DefaultLoadBalancer = true
	if _, svc := reconcile(t, r, "classless"); len(svc.Status.LoadBalancer.Ingress) != 1 {
		t.Errorf("with --default-load-balancer a classless Service is served: %+v", svc.Status)
	}
}

func TestDualStackGetsOneAddressPerFamily(t *testing.T) {
	r, _ := newReconciler(t, lbSvc("dual", func(s *corev1.Service) {
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	}))
	r.IPAM, _ = NewAllocator([]string{"10.96.255.0/24", "fd00:96::/120"})
	_, svc := reconcile(t, r, "dual")
	got := svc.Status.LoadBalancer.Ingress
	if len(got) != 2 || got[0].IP != "10.96.255.1" || got[1].IP != "fd00:96::" {
		t.Errorf("ingress %+v, want one IPv4 and one IPv6 address", got)
	}
}

// KEP-1959's cleanup finalizer is shared with the upstream service
// controller: a class-less LoadBalancer Service served by another
// implementation carries it too. Even when its address falls in ebb's pool,
// ebb (not the default load balancer) never adopts it: after a restart its
// status and finalizer stay. A Service ebb served that became a ClusterIP
// (which clears its class) is still cleaned up.
func TestRestartAdoptsOnlyServicesEbbServed(t *testing.T) {
	foreign := lbSvc("foreign", withStatus("10.96.255.7"), func(s *corev1.Service) { s.Spec.LoadBalancerClass = nil })
	formerlyOurs := lbSvc("formerly-ours", withStatus("10.96.255.8"), func(s *corev1.Service) {
		s.Spec.LoadBalancerClass, s.Spec.Type = nil, corev1.ServiceTypeClusterIP
		s.Annotations = map[string]string{lbmodel.ServedByAnnotation: lbmodel.ClassL4}
	})
	r, _ := newReconciler(t, foreign, formerlyOurs)
	if _, svc := reconcile(t, r, "foreign"); len(svc.Finalizers) != 1 || len(svc.Status.LoadBalancer.Ingress) != 1 {
		t.Errorf("another implementation's Service was touched: finalizers %v, status %+v", svc.Finalizers, svc.Status.LoadBalancer)
	}
	if _, svc := reconcile(t, r, "formerly-ours"); len(svc.Finalizers) != 0 || len(svc.Status.LoadBalancer.Ingress) != 0 {
		t.Errorf("a Service ebb served, now a ClusterIP, was not cleaned up: finalizers %v, status %+v", svc.Finalizers, svc.Status.LoadBalancer)
	}
}

// A Service ebb serves is marked as served by its class, with the
// finalizer, so that a restart can tell it from another implementation's.
func TestServedServicesAreMarked(t *testing.T) {
	r, _ := newReconciler(t, lbSvc("web"))
	if _, svc := reconcile(t, r, "web"); svc.Annotations[lbmodel.ServedByAnnotation] != lbmodel.ClassL4 {
		t.Errorf("annotations %v, want %s: %s", svc.Annotations, lbmodel.ServedByAnnotation, lbmodel.ClassL4)
	}
}

// The status lists the ports each address serves (KEP-1959's
// status.loadBalancer.ingress[].ports), and a Service written before they
// were is brought up to date.
func TestStatusListsThePorts(t *testing.T) {
	udp := lbSvc("dns", func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}, {Name: "dns-tcp", Port: 53}}
	})
	r, _ := newReconciler(t, udp, lbSvc("old", withStatus("10.96.255.9")))
	_, svc := reconcile(t, r, "dns")
	want := []corev1.PortStatus{{Port: 53, Protocol: corev1.ProtocolUDP}, {Port: 53, Protocol: corev1.ProtocolTCP}}
	if got := svc.Status.LoadBalancer.Ingress; len(got) != 1 || !slices.Equal(got[0].Ports, want) {
		t.Errorf("ingress %+v, want one address with ports %v", got, want)
	}
	_, old := reconcile(t, r, "old")
	if got := old.Status.LoadBalancer.Ingress; len(got) != 1 || got[0].IP != "10.96.255.9" || !slices.Equal(got[0].Ports, []corev1.PortStatus{{Port: 80, Protocol: corev1.ProtocolTCP}}) {
		t.Errorf("a Service written before ports were listed: %+v", got)
	}
}

// The cleanup finalizer never outlives ebb's part (issue 50 items 6 to 8):
//   - a Service that got it but never an address (the pool is full), then
//     changed type, loses it, so `kubectl delete` does not hang;
//   - a clean-up whose status write failed once is completed by the retry,
//     and the address is not given to another Service while the stale
//     status still shows it;
//   - once cleaned up, the Service no longer says ebb serves it, so a
//     restart never adopts it from the implementation that serves it next.
func TestCleanupFinalizerNeverOutlivesEbbsPart(t *testing.T) {
	t.Run("never got an address, then changed type", func(t *testing.T) {
		holder := lbSvc("holder")
		waiting := lbSvc("waiting")
		r, _ := newReconciler(t, holder, waiting)
		full, err := NewAllocator([]string{"10.96.255.1/32"})
		if err != nil {
			t.Fatal(err)
		}
		r.IPAM = full
		reconcile(t, r, "holder")
		_, svc := reconcile(t, r, "waiting")
		if len(svc.Status.LoadBalancer.Ingress) != 0 || len(svc.Finalizers) != 1 {
			t.Fatalf("the pool is full: status %+v, finalizers %v; want no address and the finalizer", svc.Status.LoadBalancer, svc.Finalizers)
		}
		svc.Spec.Type, svc.Spec.LoadBalancerClass = corev1.ServiceTypeClusterIP, nil // as the API server clears it
		if err := r.Client.Update(context.Background(), svc); err != nil {
			t.Fatal(err)
		}
		if _, svc := reconcile(t, r, "waiting"); len(svc.Finalizers) != 0 || svc.Annotations[lbmodel.ServedByAnnotation] != "" {
			t.Errorf("a ClusterIP Service ebb never gave an address keeps finalizers %v, annotations %v", svc.Finalizers, svc.Annotations)
		}
	})
	t.Run("the status write fails once", func(t *testing.T) {
		r, _ := newReconciler(t, lbSvc("web"), lbSvc("next"))
		_, svc := reconcile(t, r, "web")
		addr := svc.Status.LoadBalancer.Ingress[0].IP
		svc.Spec.Type, svc.Spec.LoadBalancerClass = corev1.ServiceTypeClusterIP, nil
		if err := r.Client.Update(context.Background(), svc); err != nil {
			t.Fatal(err)
		}
		working := r.Client
		failed := false
		r.Client = interceptor.NewClient(working.(client.WithWatch), interceptor.Funcs{
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				if !failed {
					failed = true
					return apierrors.NewServiceUnavailable("the API server is restarting")
				}
				return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			},
		})
		if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}}); err == nil {
			t.Fatal("the failed status write was not reported for a retry")
		}
		if _, next := reconcile(t, r, "next"); len(next.Status.LoadBalancer.Ingress) == 1 && next.Status.LoadBalancer.Ingress[0].IP == addr {
			t.Errorf("%s went to another Service while the first one's status still shows it", addr)
		}
		_, svc = reconcile(t, r, "web")
		if len(svc.Finalizers) != 0 || len(svc.Status.LoadBalancer.Ingress) != 0 || svc.Annotations[lbmodel.ServedByAnnotation] != "" {
			t.Errorf("after the retry: finalizers %v, status %+v, annotations %v; want none", svc.Finalizers, svc.Status.LoadBalancer, svc.Annotations)
		}
	})
}

// A Service that shares its address and is edited onto a port another
// sharer uses keeps its address and is told of the collision.
func TestAnEditThatCollidesOnASharedAddressIsReported(t *testing.T) {
	shared := func(port int32) func(*corev1.Service) {
		return func(s *corev1.Service) {
			s.Annotations = map[string]string{ShareAnnotation: "k"}
			s.Spec.Ports = []corev1.ServicePort{{Name: "p", Port: port, Protocol: corev1.ProtocolTCP}}
		}
	}
	r, rec := newReconciler(t, lbSvc("web", shared(80)), lbSvc("api", shared(8080)))
	_, web := reconcile(t, r, "web")
	_, api := reconcile(t, r, "api")
	if web.Status.LoadBalancer.Ingress[0].IP != api.Status.LoadBalancer.Ingress[0].IP {
		t.Fatalf("not shared: %v, %v", web.Status.LoadBalancer.Ingress, api.Status.LoadBalancer.Ingress)
	}
	eventstest.Recorded(rec) // drop the events so far
	api.Spec.Ports[0].Port = 80
	if err := r.Client.Update(context.Background(), api); err != nil {
		t.Fatal(err)
	}
	_, api = reconcile(t, r, "api")
	if api.Status.LoadBalancer.Ingress[0].IP != web.Status.LoadBalancer.Ingress[0].IP {
		t.Errorf("the edited Service lost its address: %v", api.Status.LoadBalancer.Ingress)
	}
	var warnings []string
	for _, e := range eventstest.Recorded(rec) {
		if strings.HasPrefix(e, "Warning") {
			warnings = append(warnings, e)
		}
	}
	if len(warnings) != 1 || !strings.HasPrefix(warnings[0], "Warning "+ReasonAddressPortCollision) || !strings.Contains(warnings[0], "port TCP/80") || !strings.Contains(warnings[0], "ns/web") {
		t.Errorf("warnings %q, want one %s naming port TCP/80 and ns/web", warnings, ReasonAddressPortCollision)
	}
}

// KEP-1864 keeps a Service's node ports when allocateLoadBalancerNodePorts
// turns false; ebb keeps serving through them and says so, once they are
// gone it says nothing.
func TestKeptNodePortsAreSaid(t *testing.T) {
	off := func(nodePort int32) func(*corev1.Service) {
		return func(s *corev1.Service) {
			s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
			s.Spec.Ports[0].NodePort = nodePort
		}
	}
	tests := []struct {
		name string
		svc  *corev1.Service
		want bool
	}{
		{"off, node ports kept", lbSvc("kept", off(30080)), true},
		{"off, node ports removed", lbSvc("removed", off(0)), false},
		{"on", lbSvc("on", func(s *corev1.Service) { s.Spec.Ports[0].NodePort = 30080 }), false},
	}
	for _, tt := range tests {
		r, rec := newReconciler(t, tt.svc)
		reconcile(t, r, tt.svc.Name)
		said := slices.ContainsFunc(eventstest.Recorded(rec), func(e string) bool { return strings.HasPrefix(e, "Normal "+ReasonNodePortsKept) })
		if said != tt.want {
			t.Errorf("%s: %s said %t, want %t", tt.name, ReasonNodePortsKept, said, tt.want)
		}
	}
}

// spec.ipFamilyPolicy decides what a Service gets when a family has no
// address: PreferDualStack gets the families that have one, RequireDualStack
// and SingleStack get nothing and a Warning that says which family is
// missing; nothing is held for a Service that got no address. A requested
// address of a family the Service does not use is refused.
func TestIPFamilyPolicyIsFollowed(t *testing.T) {
	v4, v6 := corev1.IPv4Protocol, corev1.IPv6Protocol
	policy := func(p corev1.IPFamilyPolicy, fams ...corev1.IPFamily) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Spec.IPFamilyPolicy, s.Spec.IPFamilies = &p, fams }
	}
	requested := func(addrs string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Annotations = map[string]string{RequestedIPsAnnotation: addrs} }
	}
	tests := []struct {
		name    string
		pools   []string
		svc     *corev1.Service
		want    []string
		event   string // the prefix of an event that must be recorded
		mention string // and a word it must contain
	}{
		{name: "prefer, IPv4 pools only", pools: []string{"10.96.255.0/24"},
			svc:  lbSvc("s", policy(corev1.IPFamilyPolicyPreferDualStack, v4, v6)),
			want: []string{"10.96.255.1"}, event: "Normal " + ReasonAddressFamilyUnavailable, mention: "IPv6"},
		{name: "prefer, IPv6 first, IPv6 pools only", pools: []string{"fd00:96::/120"},
			svc:  lbSvc("s", policy(corev1.IPFamilyPolicyPreferDualStack, v6, v4)),
			want: []string{"fd00:96::"}, event: "Normal " + ReasonAddressFamilyUnavailable, mention: "IPv4"},
		{name: "prefer, both pools", pools: []string{"10.96.255.0/24", "fd00:96::/120"},
			svc:  lbSvc("s", policy(corev1.IPFamilyPolicyPreferDualStack, v4, v6)),
			want: []string{"10.96.255.1", "fd00:96::"}},
		{name: "require, IPv4 pools only", pools: []string{"10.96.255.0/24"},
			svc:   lbSvc("s", policy(corev1.IPFamilyPolicyRequireDualStack, v4, v6)),
			event: "Warning " + ReasonSyncFailed, mention: "RequireDualStack"},
		{name: "single IPv6, IPv4 pools only", pools: []string{"10.96.255.0/24"},
			svc:   lbSvc("s", policy(corev1.IPFamilyPolicySingleStack, v6)),
			event: "Warning " + ReasonSyncFailed, mention: "IPv6"},
		{name: "requested IPv6 on an IPv4 Service", pools: []string{"10.96.255.0/24", "fd00:96::/120"},
			svc:   lbSvc("s", policy(corev1.IPFamilyPolicySingleStack, v4), requested("fd00:96::5")),
			event: "Warning " + ReasonSyncFailed, mention: "fd00:96::5 is IPv6"},
		{name: "require, requested IPv4 only", pools: []string{"10.96.255.0/24", "fd00:96::/120"},
			svc:   lbSvc("s", policy(corev1.IPFamilyPolicyRequireDualStack, v4, v6), requested("10.96.255.9")),
			event: "Warning " + ReasonSyncFailed, mention: "RequireDualStack"},
		{name: "prefer, requested IPv4 only", pools: []string{"10.96.255.0/24", "fd00:96::/120"},
			svc:  lbSvc("s", policy(corev1.IPFamilyPolicyPreferDualStack, v4, v6), requested("10.96.255.9")),
			want: []string{"10.96.255.9"}},
	}
	for _, tt := range tests {
		r, rec := newReconciler(t, tt.svc)
		r.IPAM, _ = NewAllocator(tt.pools)
		_, svc := reconcile(t, r, "s")
		var got []string
		for _, in := range svc.Status.LoadBalancer.Ingress {
			got = append(got, in.IP)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: addresses %v, want %v", tt.name, got, tt.want)
		}
		if held := r.IPAM.InUse(); held != len(tt.want) {
			t.Errorf("%s: %d addresses held, want %d", tt.name, held, len(tt.want))
		}
		evs := eventstest.Recorded(rec)
		if tt.event != "" && !slices.ContainsFunc(evs, func(e string) bool { return strings.HasPrefix(e, tt.event) && strings.Contains(e, tt.mention) }) {
			t.Errorf("%s: events %q, want %s mentioning %q", tt.name, evs, tt.event, tt.mention)
		}
	}
}

// An externalTrafficPolicy Local Service is told that its backends will not
// see the client's address unless it asks for PROXY protocol v2; a value of
// the annotation ebb does not know gets a Warning.
func TestClientAddressEvents(t *testing.T) {
	local := func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }
	proxyProtocol := func(v string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Annotations = map[string]string{lbmodel.ProxyProtocolAnnotation: v} }
	}
	tests := []struct {
		name string
		svc  *corev1.Service
		want string // the event's type and reason, or none
	}{
		{"Local", lbSvc("s", local), "Normal " + ReasonClientAddressNotPreserved},
		{"Local with PROXY protocol v2", lbSvc("s", local, proxyProtocol("v2")), ""},
		{"Cluster", lbSvc("s"), ""},
		{"an unknown PROXY protocol version", lbSvc("s", proxyProtocol("v1")), "Warning " + ReasonSyncFailed},
	}
	for _, tt := range tests {
		r, rec := newReconciler(t, tt.svc)
		reconcile(t, r, "s")
		var got []string
		for _, e := range eventstest.Recorded(rec) {
			if strings.Contains(e, ReasonClientAddressNotPreserved) || strings.Contains(e, lbmodel.ProxyProtocolAnnotation) {
				got = append(got, e)
			}
		}
		if tt.want == "" && len(got) > 0 || tt.want != "" && (len(got) != 1 || !strings.HasPrefix(got[0], tt.want)) {
			t.Errorf("%s: events %q, want %q", tt.name, got, tt.want)
		}
	}
}

// Issue 42 item 7: two leaders in a split brain can each give one free
// address to a different Service. After a restart the older Service keeps
// it, the younger gets another address and a Warning naming the older;
// before, both kept it (start-up recorded both silently), and two Services
// were served at one address. The names sort against the ages, as the
// API lists by name. A younger one that asked for the address itself
// cannot have it and has it taken out of its status. Services that share
// an address by a key keep it, also when one's key was edited since.
func TestASplitBrainsDuplicateAddressIsUndone(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC))
	at := func(d time.Duration) func(*corev1.Service) {
		return func(s *corev1.Service) { s.CreationTimestamp = metav1.NewTime(t0.Add(d)) }
	}
	older := lbSvc("z-older", withStatus("10.96.255.7"), at(0))
	younger := lbSvc("a-younger", withStatus("10.96.255.7"), at(time.Minute))
	asking := lbSvc("b-asking", withStatus("10.96.255.7"), at(2*time.Minute), func(s *corev1.Service) {
		s.Annotations = map[string]string{RequestedIPsAnnotation: "10.96.255.7"}
	})
	sharing := func(name, key string, d time.Duration) *corev1.Service {
		return lbSvc(name, withStatus("10.96.255.8"), at(d), func(s *corev1.Service) {
			s.Annotations = map[string]string{ShareAnnotation: key}
			s.Spec.Ports[0].Port = 80 + int32(len(name))
		})
	}
	// "edited" shared by key k when it got the address, and its key was
	// changed since.
	r, rec := newReconciler(t, younger, older, asking, sharing("one", "k", 0), sharing("edited", "other", time.Minute))
	for _, name := range []string{"a-younger", "z-older", "b-asking", "one", "edited"} {
		reconcile(t, r, name)
	}
	get := func(name string) []string {
		svc := &corev1.Service{}
		if err := r.Client.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name}, svc); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, in := range svc.Status.LoadBalancer.Ingress {
			out = append(out, in.IP)
		}
		return out
	}
	if got := get("z-older"); !slices.Equal(got, []string{"10.96.255.7"}) {
		t.Errorf("the older Service has %v, want it to keep 10.96.255.7", got)
	}
	if got := get("a-younger"); len(got) != 1 || got[0] == "10.96.255.7" {
		t.Errorf("the younger Service has %v, want another address", got)
	}
	if got := get("b-asking"); len(got) != 0 {
		t.Errorf("the younger Service that asked for the older's address has %v in its status, want none", got)
	}
	if one, edited := get("one"), get("edited"); !slices.Equal(one, []string{"10.96.255.8"}) || !slices.Equal(edited, []string{"10.96.255.8"}) {
		t.Errorf("Services sharing an address by key lost it at the restart: %v, %v", one, edited)
	}
	var warned []string
	for _, e := range eventstest.Recorded(rec) {
		if strings.HasPrefix(e, "Warning "+ReasonAddressConflict) {
			if !strings.Contains(e, "also ns/z-older's") {
				t.Errorf("a Warning that does not name the older Service: %s", e)
			}
			warned = append(warned, e)
		}
	}
	if len(warned) != 2 {
		t.Errorf("warnings %q, want one %s for each younger Service", warned, ReasonAddressConflict)
	}
}
