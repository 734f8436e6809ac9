package nodemaintenance

import (
	"context"
	"slices"
	"testing"
	"time"

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
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(&v1alpha1.NodeMaintenance{}).Build()
	rec := events.NewFakeRecorder(10)
	return &Reconciler{Client: cl, Recorder: rec, Clock: clocktesting.NewFakePassiveClock(time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC))}, cl, rec
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

// Events wake only the maintenances that have work to do on them: nodes
// wake Cordon and Drain, pods (and Evacuations, reports) only Drain; Idle
// and Complete maintenances sleep unless being deleted.
func TestEventsWakeOnlyMaintenancesWithWorkToDo(t *testing.T) {
	mk := func(name string, stage v1alpha1.NodeMaintenanceStage, deleting bool) client.Object {
		nm := &v1alpha1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.NodeMaintenanceSpec{Stage: stage}}
		if deleting {
			now := metav1.Now()
			nm.DeletionTimestamp, nm.Finalizers = &now, []string{v1alpha1.MaintenanceCompletionFinalizer}
		}
		return nm
	}
	r, _, _ := newFakeReconciler(t,
		mk("idle", v1alpha1.Idle, false), mk("cordon", v1alpha1.Cordon, false), mk("drain", v1alpha1.Drain, false),
		mk("complete", v1alpha1.Complete, false), mk("deleting", v1alpha1.Complete, true))
	names := func(f func(context.Context, client.Object) []ctrl.Request) []string {
		var out []string
		for _, req := range f(context.Background(), nil) {
			out = append(out, req.Name)
		}
		slices.Sort(out)
		return out
	}
	if got, want := names(r.maintenancesIn(v1alpha1.Cordon, v1alpha1.Drain)), []string{"cordon", "deleting", "drain"}; !slices.Equal(got, want) {
		t.Errorf("a node event wakes %v, want %v", got, want)
	}
	if got, want := names(r.maintenancesIn(v1alpha1.Drain)), []string{"deleting", "drain"}; !slices.Equal(got, want) {
		t.Errorf("a pod event wakes %v, want %v", got, want)
	}
}
