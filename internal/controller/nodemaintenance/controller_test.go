package nodemaintenance

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/drainplan"
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
	e := &v1alpha1.Evacuation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "uid-web-1", Finalizers: []string{InstigatorFinalizer, otherInstigator}}}
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
		if want := "Normal " + ReasonDrainPlanDefaulted; len(e) < len(want) || e[:len(want)] != want {
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
	if !n.Spec.Unschedulable || !hasTaint(n, drainingTaint.Key) || nodeConditionStatus(n, v1alpha1.NodeConditionMaintenanceInProgress) != corev1.ConditionTrue {
		t.Fatalf("under maintenance: unschedulable %v, taints %v, conditions %v", n.Spec.Unschedulable, n.Spec.Taints, n.Status.Conditions)
	}

	n.Labels["pool"] = "green"
	if err := cl.Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	n = reconcileAndGet()
	if n.Spec.Unschedulable || hasTaint(n, drainingTaint.Key) || n.Annotations[CordonAnnotation] != "" {
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
