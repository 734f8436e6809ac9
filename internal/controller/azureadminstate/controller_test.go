package azureadminstate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/ebbdev/ebb/internal/eventstest"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/provider/azure"
	"github.com/ebbdev/ebb/internal/provider/azure/azurefake"
)

func node(name, uid, ip string, taints ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + uid)},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
	for _, k := range taints {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: k, Effect: corev1.TaintEffectNoSchedule})
	}
	return n
}

func entryState(c *azurefake.Cloud, ip string) string {
	for _, e := range c.Pool("kubernetes", "kubernetes").Properties.LoadBalancerBackendAddresses {
		if *e.Properties.IPAddress == ip && e.Properties.AdminState != nil {
			return string(*e.Properties.AdminState)
		}
	}
	return "None"
}

// Two nodes tainted together are written in one call per pool; a failure
// is reported as a Node event and retried; untainting restores None; a
// replacement under the same name is handled afresh.
func TestTaintsDriveAzureAdminState(t *testing.T) {
	r, cloud, kube, rec, _ := setup(t, nil,
		node("a", "1", "10.0.0.1", lbmodel.TaintOutOfService), node("b", "2", "10.0.0.2", lbmodel.TaintDraining), node("c", "3", "10.0.0.3"))
	ctx := context.Background()
	req := ctrl.Request{}

	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if entryState(cloud, "10.0.0.1") != "Down" || entryState(cloud, "10.0.0.2") != "Down" || entryState(cloud, "10.0.0.3") != "None" {
		t.Fatalf("states %s %s %s", entryState(cloud, "10.0.0.1"), entryState(cloud, "10.0.0.2"), entryState(cloud, "10.0.0.3"))
	}
	if puts := cloud.Count("put"); puts != 1 {
		t.Errorf("%d writes for two nodes in one pool, want 1", puts)
	}
	if _, err := r.Reconcile(ctx, req); err != nil || cloud.Count("put") != 1 {
		t.Errorf("nothing changed, yet %d writes (%v)", cloud.Count("put"), err)
	}

	// Untaint a, with Azure failing once.
	a := &corev1.Node{}
	_ = kube.Get(ctx, client.ObjectKey{Name: "a"}, a)
	a.Spec.Taints = nil
	_ = kube.Update(ctx, a)
	cloud.FailNext = 1
	if _, err := r.Reconcile(ctx, req); err == nil {
		t.Fatal("the failure was not returned (no retry)")
	}
	if ev := <-rec.Events; !strings.Contains(ev, lbmodel.ReasonAdminStateUpdateFailed) {
		t.Errorf("event %q", ev)
	}
	if entryState(cloud, "10.0.0.1") != "Down" {
		t.Error("a failed write changed the state")
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if entryState(cloud, "10.0.0.1") != "None" {
		t.Error("untainting did not restore None")
	}
}

// setup is a cluster whose default load balancer has one IP-based node
// pool with an entry per address, Down where down says so, and a
// Reconciler on a fake clock.
func setup(t *testing.T, down map[string]bool, nodes ...client.Object) (*Reconciler, *azurefake.Cloud, client.Client, *events.FakeRecorder, *clocktesting.FakeClock) {
	t.Helper()
	cloud := azurefake.New()
	var entries []*armnetwork.LoadBalancerBackendAddress
	for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		e := &armnetwork.LoadBalancerBackendAddress{Name: ptr.To(ip), Properties: &armnetwork.LoadBalancerBackendAddressPropertiesFormat{IPAddress: ptr.To(ip)}}
		if down[ip] {
			e.Properties.AdminState = ptr.To(azure.StateDown)
		}
		entries = append(entries, e)
	}
	cloud.AddPool("kubernetes", armnetwork.BackendAddressPool{Name: ptr.To("kubernetes"), Properties: &armnetwork.BackendAddressPoolPropertiesFormat{LoadBalancerBackendAddresses: entries}})
	cfg, err := azure.ParseConfig([]byte(`{"tenantId":"t","subscriptionId":"s","resourceGroup":"rg","useManagedIdentityExtension":true,"loadBalancerBackendPoolConfigurationType":"nodeIP"}`))
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := azure.NewManager(cfg, azurefake.Credential{}, cloud.ClientOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(nodes...).Build()
	rec := events.NewFakeRecorder(100)
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC))
	return &Reconciler{Client: kube, Recorder: rec, Manager: mgr, Clock: clk}, cloud, kube, rec, clk
}

func reconcileOnce(t *testing.T, r *Reconciler) ctrl.Result {
	t.Helper()
	res, err := r.Reconcile(context.Background(), ctrl.Request{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// After a restart (nothing in memory) entries a previous run left Down
// for nodes that are no longer leaving (untainted while ebb was down, or a
// replacement with the same address) are set back to None.
func TestRestartConvergesBothWays(t *testing.T) {
	r, cloud, _, _, _ := setup(t, map[string]bool{"10.0.0.1": true, "10.0.0.2": true},
		node("a", "1", "10.0.0.1"), node("b", "2", "10.0.0.2", lbmodel.TaintDraining), node("c", "3", "10.0.0.3", lbmodel.TaintOutOfService))
	reconcileOnce(t, r)
	for ip, want := range map[string]string{"10.0.0.1": "None", "10.0.0.2": "Down", "10.0.0.3": "Down"} {
		if got := entryState(cloud, ip); got != want {
			t.Errorf("%s: %s after a restart, want %s", ip, got, want)
		}
	}
}

// While a node is Down, every DriftCheck re-reads the pools: another
// writer that puts the entry back to None (cloud-provider-azure from its
// cache) is undone within that period, and the addresses it added stay.
func TestDriftIsPutRightWhileANodeIsDown(t *testing.T) {
	r, cloud, kube, _, clk := setup(t, nil, node("a", "1", "10.0.0.1", lbmodel.TaintDraining), node("b", "2", "10.0.0.2"))
	if res := reconcileOnce(t, r); res.RequeueAfter != DefaultDriftCheck {
		t.Errorf("requeue after %s while a node is Down, want %s", res.RequeueAfter, DefaultDriftCheck)
	}
	if entryState(cloud, "10.0.0.1") != "Down" {
		t.Fatal("not Down")
	}
	cloud.Rewrite("kubernetes", "kubernetes", func(p *armnetwork.BackendAddressPool) {
		for _, e := range p.Properties.LoadBalancerBackendAddresses {
			e.Properties.AdminState = nil
		}
		p.Properties.LoadBalancerBackendAddresses = append(p.Properties.LoadBalancerBackendAddresses,
			&armnetwork.LoadBalancerBackendAddress{Name: ptr.To("10.0.0.9"), Properties: &armnetwork.LoadBalancerBackendAddressPropertiesFormat{IPAddress: ptr.To("10.0.0.9")}})
	})
	reconcileOnce(t, r)
	if entryState(cloud, "10.0.0.1") != "None" {
		t.Fatal("re-read before the drift check: the test cannot tell a drift check from any pass")
	}
	clk.Step(DefaultDriftCheck)
	reconcileOnce(t, r)
	if entryState(cloud, "10.0.0.1") != "Down" {
		t.Error("the other writer's None stayed past the drift check")
	}
	found := false
	for _, e := range cloud.Pool("kubernetes", "kubernetes").Properties.LoadBalancerBackendAddresses {
		found = found || *e.Name == "10.0.0.9"
	}
	if !found {
		t.Error("an address another writer added was removed")
	}

	a := &corev1.Node{}
	_ = kube.Get(context.Background(), client.ObjectKey{Name: "a"}, a)
	a.Spec.Taints = nil
	_ = kube.Update(context.Background(), a)
	if res := reconcileOnce(t, r); res.RequeueAfter != resync || entryState(cloud, "10.0.0.1") != "None" {
		t.Errorf("no node Down: requeue after %s, state %s; want %s and None", res.RequeueAfter, entryState(cloud, "10.0.0.1"), resync)
	}
}

// A failure that repeats is one Warning event, not one per retry; a new
// failing state is a new event.
func TestOneFailureEventPerFailingTransition(t *testing.T) {
	r, cloud, kube, rec, _ := setup(t, nil, node("a", "1", "10.0.0.1", lbmodel.TaintDraining))
	cloud.FailNext = 3
	for range 3 {
		if _, err := r.Reconcile(context.Background(), ctrl.Request{}); err == nil {
			t.Fatal("the failure was not returned (no retry)")
		}
	}
	if n := len(rec.Events); n != 1 {
		t.Errorf("%d events for one failing transition retried 3 times, want 1", n)
	}
	reconcileOnce(t, r)
	a := &corev1.Node{}
	_ = kube.Get(context.Background(), client.ObjectKey{Name: "a"}, a)
	a.Spec.Taints = nil
	_ = kube.Update(context.Background(), a)
	cloud.FailNext = 1
	if _, err := r.Reconcile(context.Background(), ctrl.Request{}); err == nil {
		t.Fatal("the failure was not returned")
	}
	if n := len(rec.Events); n != 2 {
		t.Errorf("%d events after a second failing transition, want 2", n)
	}
}

// A deleted node's entries turn Down before cloud-provider-azure removes
// them (seed 000's EnsureLoadBalancerDeleted path); a node replaced by one
// with the same address is left as the new node wants.
func TestDeletedNodeTurnsDownFirst(t *testing.T) {
	r, cloud, kube, _, _ := setup(t, nil, node("a", "1", "10.0.0.1"), node("b", "2", "10.0.0.2"))
	reconcileOnce(t, r)
	ctx := context.Background()
	if err := kube.Delete(ctx, node("b", "2", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	if err := kube.Delete(ctx, node("a", "1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	if err := kube.Create(ctx, node("a2", "4", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	reconcileOnce(t, r)
	if got := entryState(cloud, "10.0.0.2"); got != "Down" {
		t.Errorf("the deleted node's entry is %s, want Down", got)
	}
	if got := entryState(cloud, "10.0.0.1"); got != "None" {
		t.Errorf("the address a replacement took over is %s, want None", got)
	}
	puts := cloud.Count("put")
	reconcileOnce(t, r)
	if cloud.Count("put") != puts {
		t.Error("the deleted node is written again and again")
	}
}

// A leaving node that no pool holds gets one Warning event saying so, not
// a success, and does not hold back the others.
func TestUnmatchedNodeGetsOneEvent(t *testing.T) {
	r, cloud, _, rec, clk := setup(t, nil, node("a", "1", "10.0.0.1", lbmodel.TaintDraining), node("stray", "9", "10.9.9.9", lbmodel.TaintDraining))
	reconcileOnce(t, r)
	if entryState(cloud, "10.0.0.1") != "Down" {
		t.Error("the matched node was held back")
	}
	evs := eventstest.Recorded(rec)
	if len(evs) != 1 || !strings.Contains(evs[0], "Warning "+ReasonBackendNotFound) || !strings.Contains(evs[0], "stray") {
		t.Fatalf("events %q, want one %s about stray", evs, ReasonBackendNotFound)
	}
	clk.Step(DefaultDriftCheck)
	reconcileOnce(t, r)
	if evs := eventstest.Recorded(rec); len(evs) != 0 {
		t.Errorf("the event repeats: %q", evs)
	}
}

// A failure is also a Warning on the Services whose traffic the node
// carries: Azure's LoadBalancer Services with externalTrafficPolicy
// Cluster, and Local ones with an endpoint on the node; not ebb's own
// class, not Local ones elsewhere.
func TestFailureIsReportedOnAffectedServices(t *testing.T) {
	svc := func(name string, mutate func(*corev1.Service)) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}}
		if mutate != nil {
			mutate(s)
		}
		return s
	}
	local := func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }
	slice := func(service, nodeName string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: service + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: service}},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.5"}, NodeName: ptr.To(nodeName)}}}
	}
	r, cloud, _, rec, _ := setup(t, nil, node("a", "1", "10.0.0.1", lbmodel.TaintDraining),
		svc("cluster", nil), svc("local-here", local), svc("local-elsewhere", local), svc("ebb", func(s *corev1.Service) { s.Spec.LoadBalancerClass = ptr.To("ebb.dev/l4") }),
		slice("local-here", "a"), slice("local-elsewhere", "b"))
	cloud.FailNext = 1
	if _, err := r.Reconcile(context.Background(), ctrl.Request{}); err == nil {
		t.Fatal("the failure was not returned")
	}
	var onServices []string
	for _, e := range eventstest.Recorded(rec) {
		if strings.Contains(e, "carry this Service's traffic") {
			onServices = append(onServices, e)
		}
	}
	if len(onServices) != 2 {
		t.Errorf("%d Service events, want 2 (cluster, local-here): %q", len(onServices), onServices)
	}
}

// Node events wake the controller often; each asks to be woken for the
// next drift check when it is due, counted from the last full pass, not
// from now (else frequent events push the check back).
func TestDriftCheckIsNotPushedBackByEvents(t *testing.T) {
	r, _, _, _, clk := setup(t, nil, node("a", "1", "10.0.0.1", lbmodel.TaintDraining))
	reconcileOnce(t, r) // a full pass
	clk.Step(3 * time.Second)
	if res := reconcileOnce(t, r); res.RequeueAfter != 2*time.Second {
		t.Errorf("an event 3 s after the full pass asks to be woken after %s, want 2 s (when the drift check is due)", res.RequeueAfter)
	}
}
