package nodemaintenance

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

	"errors"
	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/drainplan"
	"github.com/ebbdev/ebb/internal/eventstest"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

func newFakeReconciler(t *testing.T, objs ...client.Object) (*Reconciler, client.Client, *events.FakeRecorder) {
	t.Helper()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.NodeMaintenance{}, &v1alpha1.Evacuation{}).
		WithIndex(&corev1.Pod{}, podNodeIndex, func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).
		Build()
	rec := events.NewFakeRecorder(100)
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return &Reconciler{Client: cl, Recorder: rec, Metrics: m, Clock: clocktesting.NewFakePassiveClock(time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC))}, cl, rec
}

const otherInstigator = v1alpha1.InstigatorFinalizerPrefix + "someone-else"

// Withdrawing removes only our finalizer: another instigator's request
// stays, and the Evacuation is not deleted under it (its controller leaves
// a deleting Evacuation alone, so that request would stall).
func TestWithdrawLeavesOtherInstigatorsRequests(t *testing.T) {
	e := &v1alpha1.Evacuation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "uid-web-1", Finalizers: []string{v1alpha1.InstigatorFinalizer, otherInstigator}}}
	r, cl, _ := newFakeReconciler(t, e)
	if err := r.withdraw(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	got := &v1alpha1.Evacuation{}
	if err := cl.Get(context.Background(), client.ObjectKeyFromObject(e), got); err != nil {
		t.Fatalf("the Evacuation is gone: %v", err)
	}
	if got.DeletionTimestamp != nil || !slices.Equal(got.Finalizers, []string{otherInstigator}) {
		t.Errorf("deleting %v, finalizers %v: want not deleting, with only the other instigator's", got.DeletionTimestamp, got.Finalizers)
	}
}

// An Evacuation someone deletes while our finalizer holds it does not hang
// the drain: the maintenance lets it go and, the pod still being a target,
// asks for its evacuation again.
func TestDeletedEvacuationIsAskedForAgain(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1", UID: "uid-1"}, Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "m", Finalizers: []string{v1alpha1.MaintenanceCompletionFinalizer}},
		Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain, Reason: "test", DrainPlan: drainplan.Defaults(), NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}},
		}}}},
	}
	r, cl, _ := newFakeReconciler(t, node, pod, nm)
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(nm)}
	key := client.ObjectKey{Namespace: "ns", Name: v1alpha1.EvacuationName(pod.UID, pod.Name)}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	e := &v1alpha1.Evacuation{}
	if err := cl.Get(ctx, key, e); err != nil {
		t.Fatalf("no Evacuation for the pod: %v", err)
	}
	if e.Annotations[v1alpha1.RequestedByAnnotation] != "m" || e.Annotations[v1alpha1.ReasonAnnotation] != "test" {
		t.Errorf("annotations %v, want the maintenance and its reason", e.Annotations)
	}

	// A user deletes it; our finalizer holds it.
	if err := cl.Delete(ctx, e); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := cl.Get(ctx, key, &v1alpha1.Evacuation{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the deleted Evacuation is still held: %v", err)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	again := &v1alpha1.Evacuation{}
	if err := cl.Get(ctx, key, again); err != nil || again.DeletionTimestamp != nil {
		t.Fatalf("the pod's evacuation was not asked for again: %v %v", err, again.DeletionTimestamp)
	}
}

// A maintenance created without a drain plan (admission off) gets the
// default plan from the controller, once, with an event; before, it
// cordoned and tainted and never evacuated anything.
func TestMaintenanceWithoutDrainPlanGetsTheDefaults(t *testing.T) {
	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "no-plan", Finalizers: []string{v1alpha1.MaintenanceCompletionFinalizer}},
		Spec:       v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain, Reason: "test"},
	}
	r, cl, rec := newFakeReconciler(t, nm)
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(nm)}); err != nil {
		t.Fatal(err)
	}
	got := &v1alpha1.NodeMaintenance{}
	if err := cl.Get(context.Background(), client.ObjectKeyFromObject(nm), got); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Spec.DrainPlan, drainplan.Defaults()) {
		t.Fatalf("drain plan %v, want the defaults", got.Spec.DrainPlan)
	}
	select {
	case e := <-rec.Events:
		if want := "Normal " + v1alpha1.ReasonDrainPlanDefaulted; len(e) < len(want) || e[:len(want)] != want {
			t.Errorf("event %q, want %s", e, want)
		}
	default:
		t.Error("no event says the plan was defaulted")
	}
}

// A node that leaves the selector in the middle of a drain gets back what
// ebb took: its cordon, the draining taint, the annotation, and its
// maintenance conditions turn False.
func TestNodeThatLeavesTheSelectorIsReleased(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"pool": "blue"}}}
	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "m", Finalizers: []string{v1alpha1.MaintenanceCompletionFinalizer}},
		Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain, Reason: "test", DrainPlan: drainplan.Defaults(), NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"blue"}}},
		}}}},
	}
	r, cl, _ := newFakeReconciler(t, node, nm)
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(nm)}
	reconcileAndGet := func() *corev1.Node {
		t.Helper()
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
		n := &corev1.Node{}
		if err := cl.Get(ctx, client.ObjectKey{Name: "n1"}, n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := reconcileAndGet()
	if !n.Spec.Unschedulable || !hasTaint(n, drainplan.DrainingTaint().Key) || nodeConditionStatus(n, v1alpha1.NodeConditionMaintenanceInProgress) != corev1.ConditionTrue {
		t.Fatalf("under maintenance: unschedulable %v, taints %v, conditions %v", n.Spec.Unschedulable, n.Spec.Taints, n.Status.Conditions)
	}

	n.Labels["pool"] = "green"
	if err := cl.Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	n = reconcileAndGet()
	if n.Spec.Unschedulable || hasTaint(n, drainplan.DrainingTaint().Key) || n.Annotations[v1alpha1.CordonAnnotation] != "" {
		t.Errorf("after leaving the selector: unschedulable %v, taints %v, annotations %v", n.Spec.Unschedulable, n.Spec.Taints, n.Annotations)
	}
	if s := nodeConditionStatus(n, v1alpha1.NodeConditionMaintenanceInProgress); s != corev1.ConditionFalse {
		t.Errorf("MaintenanceInProgress is %q after leaving the selector, want False", s)
	}
	for _, typ := range []string{v1alpha1.NodeConditionDrainInProgress, v1alpha1.NodeConditionDrained} {
		if s := nodeConditionStatus(n, typ); s == corev1.ConditionTrue {
			t.Errorf("%s is still True after leaving the selector", typ)
		}
	}
}

func nodeConditionStatus(n *corev1.Node, typ string) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if string(c.Type) == typ {
			return c.Status
		}
	}
	return ""
}

// The node status counts pods as KEP-4212's example does: every pod on the
// node that has no Evacuation yet is pending (targeted now or later), every
// pod with one is evacuating; drainTargets and drainMessage follow the
// plan. (The example shows node one with 100 pending while only priority
// 5000 and below is targeted.)
func TestNodeStatusCountsPodsAsTheKEPDoes(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "one"}}
	pod := func(name string, priority int32, daemonSet bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
			Spec: corev1.PodSpec{NodeName: "one", Priority: &priority}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		if daemonSet {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", UID: "ds", Controller: ptr.To(true)}}
		}
		return p
	}
	low, high, agent := pod("low", 1000, false), pod("high", 12000, false), pod("agent", 2000, true)
	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "maintenance-a", Finalizers: []string{v1alpha1.MaintenanceCompletionFinalizer}},
		Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain, Reason: "OS upgrade",
			DrainPlan: drainplan.WithDefaults([]v1alpha1.DrainPlanEntry{
				{PodPriority: 5000, PodType: v1alpha1.Default}, {PodPriority: 15000, PodType: v1alpha1.Default}, {PodPriority: 3000, PodType: v1alpha1.DaemonSet},
			}),
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"one"}}},
			}}}},
	}
	r, cl, _ := newFakeReconciler(t, node, low, high, agent, nm)
	ctx := context.Background()
	status := func() v1alpha1.NodeMaintenanceNodeStatus {
		t.Helper()
		got := reconcileMaintenance(t, r, cl, nm)
		if len(got.Status.NodeStatuses) != 1 {
			t.Fatalf("node statuses %v, want one", got.Status.NodeStatuses)
		}
		return got.Status.NodeStatuses[0]
	}
	check := func(step string, ns v1alpha1.NodeMaintenanceNodeStatus, pending, evacuating int32, targets drainplan.Level) {
		t.Helper()
		if ns.PodsPendingEvacuation != pending || ns.PodsEvacuating != evacuating || ns.DrainMessage != "Evacuating" || drainplan.LevelOf(ns.DrainTargets) != targets {
			t.Errorf("%s: pending %d evacuating %d message %q targets %v; want %d, %d, \"Evacuating\", %v",
				step, ns.PodsPendingEvacuation, ns.PodsEvacuating, ns.DrainMessage, ns.DrainTargets, pending, evacuating, targets)
		}
	}
	check("start", status(), 2, 1, drainplan.Level{Rank: 0, Priority: 5000, General: 5000})

	// The low-priority pod leaves: the next entry targets the other pod.
	if err := cl.Delete(ctx, low); err != nil {
		t.Fatal(err)
	}
	status() // advances the plan; the Evacuation is created on the next pass
	check("5000 drained", status(), 1, 1, drainplan.Level{Rank: 0, Priority: 15000, General: 15000})
	if n := testutil.CollectAndCount(r.Metrics.pods); n != 2 {
		t.Errorf("%d series of ebb_nodemaintenance_pods while draining, want 2 (pending, evacuating)", n)
	}

	// Moved on to Complete with a pod left: no longer draining, so no
	// pod counts (a gauge frozen at the drain's last value would read as
	// a drain that stopped moving).
	cur := &v1alpha1.NodeMaintenance{}
	if err := cl.Get(ctx, client.ObjectKeyFromObject(nm), cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Stage = v1alpha1.Complete
	if err := cl.Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	reconcileMaintenance(t, r, cl, cur)
	if n := testutil.CollectAndCount(r.Metrics.pods); n != 0 {
		t.Errorf("%d series of ebb_nodemaintenance_pods after the maintenance left Drain, want none", n)
	}
}

// A newer maintenance whose node an older one has already drained further
// is fast-forwarded, says so in drainMessage, and records a Warning event,
// as KEP-4212 asks ("we can at least emit an event saying that we are
// fast-forwarding maintenance-c due to existing older maintenance(s)").
func TestFastForwardedMaintenanceIsReported(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "one"}}
	priority := int32(9000)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db", UID: "uid-db"},
		Spec: corev1.PodSpec{NodeName: "one", Priority: &priority}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	t0 := metav1.NewTime(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
	// As in the KEP, maintenance-c also selects node four, whose pod keeps
	// it at its first entry.
	four := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "four"}}
	lowPriority := int32(1000)
	web := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "uid-web"},
		Spec: corev1.PodSpec{NodeName: "four", Priority: &lowPriority}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	maintenance := func(name string, created metav1.Time, first int32, nodes ...string) *v1alpha1.NodeMaintenance {
		var terms []corev1.NodeSelectorTerm // one per node: a field selector takes one name
		for _, n := range nodes {
			terms = append(terms, corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{n}}}})
		}
		return &v1alpha1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: created, Finalizers: []string{v1alpha1.MaintenanceCompletionFinalizer}},
			Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain, Reason: "test",
				DrainPlan:    drainplan.WithDefaults([]v1alpha1.DrainPlanEntry{{PodPriority: first, PodType: v1alpha1.Default}}),
				NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: terms}},
		}
	}
	b := maintenance("maintenance-b", t0, 10000, "one")
	r, cl, rec := newFakeReconciler(t, node, four, pod, web, b)
	ctx := context.Background()
	reconcile := func(nm *v1alpha1.NodeMaintenance) v1alpha1.NodeMaintenanceNodeStatus {
		t.Helper()
		got := reconcileMaintenance(t, r, cl, nm)
		ns := oldNodeStatus(got, "one")
		if ns == nil {
			t.Fatalf("%s: no status for node one in %v", nm.Name, got.Status.NodeStatuses)
		}
		return *ns
	}
	if ns := reconcile(b); ns.DrainMessage != "Evacuating" {
		t.Fatalf("maintenance-b: %q", ns.DrainMessage)
	}
	eventstest.Recorded(rec)

	c := maintenance("maintenance-c", metav1.NewTime(t0.Add(time.Hour)), 2000, "one", "four")
	if err := cl.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	ns := reconcile(c)
	if want := "Evacuating (fast-forwarded by older maintenance-b)"; ns.DrainMessage != want || drainplan.LevelOf(ns.DrainTargets).Priority != 10000 {
		t.Errorf("maintenance-c: message %q targets %v, want %q at 10000", ns.DrainMessage, ns.DrainTargets, want)
	}
	if got := eventstest.Recorded(rec); !slices.ContainsFunc(got, func(e string) bool { return strings.Contains(e, "Warning "+v1alpha1.ReasonFastForwarded) }) {
		t.Errorf("events %q, want a Warning %s", got, v1alpha1.ReasonFastForwarded)
	}
	reconcile(c)
	if got := eventstest.Recorded(rec); slices.ContainsFunc(got, func(e string) bool { return strings.Contains(e, v1alpha1.ReasonFastForwarded) }) {
		t.Errorf("the event repeats on the next pass: %q", got)
	}
}

// reconcileMaintenance reconciles nm once and returns it as stored.
func reconcileMaintenance(t *testing.T, r *Reconciler, cl client.Client, nm *v1alpha1.NodeMaintenance) *v1alpha1.NodeMaintenance {
	t.Helper()
	ctx := context.Background()
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(nm)}); err != nil {
		t.Fatal(err)
	}
	got := &v1alpha1.NodeMaintenance{}
	if err := cl.Get(ctx, client.ObjectKeyFromObject(nm), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// A step that fails shows in the maintenance's status, with the step and
// the error, once however often it is retried, and clears when it passes.
func TestFailingStepShowsInTheStatus(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "m", Finalizers: []string{v1alpha1.MaintenanceCompletionFinalizer}},
		Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Cordon, Reason: "test", DrainPlan: drainplan.Defaults(), NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}},
		}}}},
	}
	r, cl, _ := newFakeReconciler(t, node, nm)
	failing := true
	statusWrites := 0
	r.Client = interceptor.NewClient(cl.(client.WithWatch), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*corev1.Node); ok && failing {
				return apierrors.NewForbidden(corev1.Resource("nodes"), "n1", errors.New("a policy forbids it"))
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if _, ok := obj.(*corev1.Node); ok && failing {
				return apierrors.NewForbidden(corev1.Resource("nodes"), "n1", errors.New("a policy forbids it"))
			}
			return c.Update(ctx, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			statusWrites++
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	})
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(nm)}
	for range 3 {
		if _, err := r.Reconcile(ctx, req); err == nil {
			t.Fatal("the failing cordon was not returned")
		}
	}
	got := &v1alpha1.NodeMaintenance{}
	if err := cl.Get(ctx, req.NamespacedName, got); err != nil {
		t.Fatal(err)
	}
	c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ReconciledCondition)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "CordonFailed" || !strings.Contains(c.Message, "a policy forbids it") {
		t.Fatalf("condition %+v, want Reconciled=False CordonFailed with the error", c)
	}
	if statusWrites != 1 {
		t.Errorf("%d status writes for a failure retried 3 times, want 1", statusWrites)
	}
	failing = false
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := cl.Get(ctx, req.NamespacedName, got); err != nil {
		t.Fatal(err)
	}
	if !meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ReconciledCondition) {
		t.Errorf("conditions %+v after the cordon passed, want Reconciled=True", got.Status.Conditions)
	}
}

// ebb's own labels on an Evacuation win over the pod's (issue 41 item 7):
// a pod labelled maintenance.ebb.dev/node=elsewhere still gets an
// Evacuation labelled with its real node, and keeps its other labels.
func TestEvacuationLabelsAreEbbsOverThePods(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1", UID: "uid-1", Labels: map[string]string{
		v1alpha1.EvacuationNodeLabel: "elsewhere", "app": "web"}}, Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "m", Finalizers: []string{v1alpha1.MaintenanceCompletionFinalizer}},
		Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain, Reason: "test", DrainPlan: drainplan.Defaults(), NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}},
		}}}},
	}
	r, cl, _ := newFakeReconciler(t, node, pod, nm)
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(nm)}); err != nil {
		t.Fatal(err)
	}
	e := &v1alpha1.Evacuation{}
	if err := cl.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: v1alpha1.EvacuationName(pod.UID, pod.Name)}, e); err != nil {
		t.Fatalf("no Evacuation for the pod: %v", err)
	}
	if e.Labels[v1alpha1.EvacuationNodeLabel] != "n1" || e.Labels["app"] != "web" {
		t.Errorf("labels %v, want %s=n1 and app=web", e.Labels, v1alpha1.EvacuationNodeLabel)
	}
}

// A plan stored without the defaults (the webhook was off at creation)
// drains as admission would have defaulted it (issue 41 item 5): a pod
// beyond the user's entries is evacuated too, and the maintenance is not
// Drained while it is there. Before, Drained came after the user's
// entries only.
func TestAPlanWithoutTheDefaultsDrainsEveryPod(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "important", UID: "uid-1"},
		Spec: corev1.PodSpec{NodeName: "n1", Priority: ptr.To[int32](5000)}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "m", Finalizers: []string{v1alpha1.MaintenanceCompletionFinalizer}},
		Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain, Reason: "test", DrainPlan: []v1alpha1.DrainPlanEntry{{PodType: v1alpha1.Default, PodPriority: 100}},
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}},
			}}}},
	}
	r, cl, _ := newFakeReconciler(t, node, pod, nm)
	ctx := context.Background()
	for range 5 {
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(nm)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "ns", Name: v1alpha1.EvacuationName(pod.UID, pod.Name)}, &v1alpha1.Evacuation{}); err != nil {
		t.Errorf("the priority-5000 pod beyond the user's plan was not asked to evacuate: %v", err)
	}
	got := &v1alpha1.NodeMaintenance{}
	if err := cl.Get(ctx, client.ObjectKeyFromObject(nm), got); err != nil {
		t.Fatal(err)
	}
	if meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.DrainedCondition) {
		t.Errorf("Drained while a pod is on the node: %v", got.Status.Conditions)
	}
}

// An Evacuation another instigator created (no node label) that the
// maintenance adopts is released on Complete (issue 41 item 4): before, the
// maintenance's finalizer stayed on it, so the pod was evicted after every
// instigator had withdrawn.
func TestAdoptedEvacuationIsReleasedOnComplete(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1", UID: "uid-1"}, Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	theirs := &v1alpha1.Evacuation{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: v1alpha1.EvacuationName(pod.UID, pod.Name), Finalizers: []string{otherInstigator}},
		Spec:       v1alpha1.EvacuationSpec{PodRef: v1alpha1.PodReference{Name: pod.Name, UID: pod.UID}, ProgressDeadlineSeconds: 600},
	}
	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "m", Finalizers: []string{v1alpha1.MaintenanceCompletionFinalizer}},
		Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain, Reason: "test", DrainPlan: drainplan.Defaults(), NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}},
		}}}},
	}
	r, cl, _ := newFakeReconciler(t, node, pod, theirs, nm)
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(nm)}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	e := &v1alpha1.Evacuation{}
	if err := cl.Get(ctx, client.ObjectKeyFromObject(theirs), e); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(e.Finalizers, v1alpha1.InstigatorFinalizer) {
		t.Fatalf("the maintenance did not adopt the Evacuation: finalizers %v", e.Finalizers)
	}
	got := &v1alpha1.NodeMaintenance{}
	if err := cl.Get(ctx, req.NamespacedName, got); err != nil {
		t.Fatal(err)
	}
	got.Spec.Stage = v1alpha1.Complete
	if err := cl.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := cl.Get(ctx, client.ObjectKeyFromObject(theirs), e); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(e.Finalizers, []string{otherInstigator}) {
		t.Errorf("after Complete: finalizers %v, want only the other instigator's", e.Finalizers)
	}
}

// Issue 41 item 3, through the controller: a node that the selector takes
// in after the drain reached the DaemonSet entry starts at the plan's first
// entry (recorded in its status as drainPlanIndex 0), so its DaemonSet pod
// (a CNI agent, say) gets no Evacuation while the node's other pods are
// still there; the node already drained keeps its entry.
func TestANodeJoiningMidDrainStartsFromTheFirstEntry(t *testing.T) {
	pool := map[string]string{"pool": "a"}
	one := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "one", Labels: pool}}
	two := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "two"}}
	pod := func(name, node string, priority int32, daemonSet bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
			Spec: corev1.PodSpec{NodeName: node, Priority: &priority}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		if daemonSet {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "cni", UID: "ds", Controller: ptr.To(true)}}
		}
		return p
	}
	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "upgrade", Finalizers: []string{v1alpha1.MaintenanceCompletionFinalizer}},
		Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain, Reason: "OS upgrade", DrainPlan: drainplan.Defaults(),
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}},
			}}}},
	}
	r, cl, _ := newFakeReconciler(t, one, two, pod("cni-one", "one", 2000, true), pod("cni-two", "two", 2000, true), pod("web", "two", 1000, false), nm)
	ctx := context.Background()
	got := reconcileMaintenance(t, r, cl, nm)
	got = reconcileMaintenance(t, r, cl, got)
	reached := got.Status.DrainPlanIndex
	if got.Spec.DrainPlan[reached].PodType != v1alpha1.DaemonSet {
		t.Fatalf("the drain of node one reached entry %d (%v), want the DaemonSet entry", reached, got.Spec.DrainPlan)
	}

	two.Labels = pool
	if err := cl.Update(ctx, two); err != nil {
		t.Fatal(err)
	}
	got = reconcileMaintenance(t, r, cl, got)
	got = reconcileMaintenance(t, r, cl, got)
	if ns := oldNodeStatus(got, "two"); ns == nil || ns.DrainPlanIndex == nil || *ns.DrainPlanIndex != 0 || drainplan.LevelOf(ns.DrainTargets) != drainplan.LevelAt(got.Spec.DrainPlan, 0) {
		t.Errorf("node two joined with status %+v, want drainPlanIndex 0 and the first entry's targets", ns)
	}
	if ns := oldNodeStatus(got, "one"); ns == nil || ns.DrainPlanIndex == nil || *ns.DrainPlanIndex != reached {
		t.Errorf("node one: status %+v, want drainPlanIndex %d", ns, reached)
	}
	var evs v1alpha1.EvacuationList
	if err := cl.List(ctx, &evs); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range evs.Items {
		names = append(names, e.Name)
	}
	if !slices.Contains(names, "uid-web-web") || slices.Contains(names, "uid-cni-two-cni-two") {
		t.Errorf("Evacuations %v, want web's and not node two's DaemonSet pod's", names)
	}
}

// A pod whose namespace is being deleted gets no Evacuation (the API
// server refuses new objects there) and holds nothing up: it leaves with
// its namespace. Before, the refusal failed the whole pass after the
// other pods' Evacuations were created, so the status never recorded the
// entry reached (a node joining meanwhile joined at entry 0 as if the
// drain had not started: e2e TestANodeJoiningADrainStartsFromTheFirstEntry
// failed so in CI, a previous test's namespace still terminating).
func TestAPodInATerminatingNamespaceHoldsNothingUp(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	daemonPod := func(ns, name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", UID: "ds", Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "m", Finalizers: []string{v1alpha1.MaintenanceCompletionFinalizer}},
		Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain, Reason: "test", DrainPlan: drainplan.Defaults(), NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}},
		}}}},
	}
	r, cl, _ := newFakeReconciler(t, node, daemonPod("live", "agent-1"), daemonPod("gone", "agent-2"), nm)
	r.Client = interceptor.NewClient(cl.(client.WithWatch), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if obj.GetNamespace() == "gone" {
				// What the NamespaceLifecycle admission plugin answers.
				err := apierrors.NewForbidden(v1alpha1.GroupVersion.WithResource("evacuations").GroupResource(), obj.GetName(),
					errors.New("unable to create new content in namespace gone because it is being terminated"))
				err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{Type: corev1.NamespaceTerminatingCause, Field: "gone"})
				return err
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	got := reconcileMaintenance(t, r, cl, nm)
	if at := got.Status.DrainPlanIndex; got.Spec.DrainPlan[at].PodType != v1alpha1.DaemonSet {
		t.Errorf("status at entry %d (%v), want the DaemonSet entry recorded", at, got.Spec.DrainPlan[at])
	}
	e := &v1alpha1.Evacuation{}
	if err := cl.Get(context.Background(), client.ObjectKey{Namespace: "live", Name: v1alpha1.EvacuationName("uid-agent-1", "agent-1")}, e); err != nil {
		t.Errorf("no Evacuation of the live namespace's pod: %v", err)
	}
}
