package deletionhold

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
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

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbhost"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

type fixture struct {
	t      *testing.T
	client client.Client
	clock  *clocktesting.FakePassiveClock
	rec    *events.FakeRecorder
	r      *Reconciler
}

func newFixture(t *testing.T, enabled bool, objs ...client.Object) *fixture {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, clock: clocktesting.NewFakePassiveClock(time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC)), rec: events.NewFakeRecorder(20)}
	f.client = fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(&v1alpha1.LoadBalancerReport{}).Build()
	f.r = &Reconciler{Client: f.client, Recorder: f.rec, Metrics: m, Clock: f.clock, Enabled: enabled, Timeout: time.Minute}
	return f
}

// reconcile runs one pass over node n and returns whether it is held, the
// result and the events it emitted.
func (f *fixture) reconcile(name string) (bool, ctrl.Result, []string) {
	f.t.Helper()
	res, err := f.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: name}})
	if err != nil {
		f.t.Fatal(err)
	}
	var n corev1.Node
	if err := f.client.Get(context.Background(), types.NamespacedName{Name: name}, &n); err != nil {
		f.t.Fatal(err)
	}
	var evs []string
	for len(f.rec.Events) > 0 {
		evs = append(evs, <-f.rec.Events)
	}
	_, held := n.Annotations[Annotation]
	return held, res, evs
}

// setReport writes the one ebb lb replica's report: the node's admin state
// and connections, fresh now.
func (f *fixture) setReport(node, state string, connections int64) {
	f.t.Helper()
	ts := metav1.NewMicroTime(f.clock.Now())
	rep := &v1alpha1.LoadBalancerReport{ObjectMeta: metav1.ObjectMeta{Name: "lb-1"}}
	_ = f.client.Get(context.Background(), types.NamespacedName{Name: "lb-1"}, rep)
	rep.Status = v1alpha1.LoadBalancerReportStatus{Replica: "lb-1", RenewTime: &ts, HeartbeatSeconds: 10,
		Nodes: []v1alpha1.NodeTraffic{{Name: node, AdminState: v1alpha1.AdminState(state), Connections: connections}}}
	if rep.ResourceVersion == "" {
		if err := f.client.Create(context.Background(), rep); err != nil {
			f.t.Fatal(err)
		}
	}
	if err := f.client.Status().Update(context.Background(), rep); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) taint(name, key string) {
	f.t.Helper()
	var n corev1.Node
	if err := f.client.Get(context.Background(), types.NamespacedName{Name: name}, &n); err != nil {
		f.t.Fatal(err)
	}
	n.Spec.Taints = []corev1.Taint{{Key: key, Value: "1764316800", Effect: corev1.TaintEffectNoSchedule}}
	if err := f.client.Update(context.Background(), &n); err != nil {
		f.t.Fatal(err)
	}
}

func node(name string, annotations, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Annotations: annotations, Labels: labels}}
}

// The hold's life on one node: added while in rotation, kept while the
// node leaves with connections through it, released once none is left.
func TestHeldUntilDrained(t *testing.T) {
	f := newFixture(t, true, node("n1", nil, nil))
	if held, _, evs := f.reconcile("n1"); !held || len(evs) != 0 {
		t.Fatalf("a node in rotation: held %v, events %q; want held quietly", held, evs)
	}
	f.setReport("n1", "None", 4)
	f.taint("n1", lbmodel.TaintToBeDeleted)
	f.setReport("n1", "Down", 3)
	held, res, evs := f.reconcile("n1")
	if !held || res.RequeueAfter != poll || len(evs) != 1 || !strings.Contains(evs[0], ReasonHeld) {
		t.Fatalf("leaving with 3 connections: held %v, result %+v, events %q; want held, looked at again in %s, one %s", held, res, evs, poll, ReasonHeld)
	}
	f.clock.SetTime(f.clock.Now().Add(10 * time.Second))
	f.setReport("n1", "Down", 1)
	if held, _, evs := f.reconcile("n1"); !held || len(evs) != 0 {
		t.Fatalf("1 connection left: held %v, events %q; want held, no new event", held, evs)
	}
	if got := testutil.ToFloat64(f.r.Metrics.waiting); got != 1 {
		t.Errorf("leaving nodes held: %v, want 1", got)
	}
	f.setReport("n1", "Down", 0)
	held, res, evs = f.reconcile("n1")
	if held || res.RequeueAfter != 0 || len(evs) != 1 || !strings.Contains(evs[0], ReasonReleased) {
		t.Fatalf("drained: held %v, result %+v, events %q; want released with one %s", held, res, evs, ReasonReleased)
	}
	if got := testutil.ToFloat64(f.r.Metrics.releases.WithLabelValues("drained")); got != 1 {
		t.Errorf("releases{drained} = %v", got)
	}
	if got := testutil.ToFloat64(f.r.Metrics.waiting); got != 0 {
		t.Errorf("leaving nodes held: %v, want 0", got)
	}
	// Still leaving, released: not held again. Back in rotation: held.
	if held, _, _ := f.reconcile("n1"); held {
		t.Error("a released leaving node was held again")
	}
	f.taint("n1", "example.com/other")
	if held, _, _ := f.reconcile("n1"); !held {
		t.Error("a node back in rotation was not held again")
	}

	// Deleted while held (the autoscaler's timeout shorter than ebb's):
	// nothing is left waiting.
	f.taint("n1", lbmodel.TaintToBeDeleted)
	f.setReport("n1", "Down", 2)
	if held, _, _ := f.reconcile("n1"); !held {
		t.Fatal("not held while leaving with connections")
	}
	var n corev1.Node
	if err := f.client.Get(context.Background(), types.NamespacedName{Name: "n1"}, &n); err != nil {
		t.Fatal(err)
	}
	if err := f.client.Delete(context.Background(), &n); err != nil {
		t.Fatal(err)
	}
	if _, err := f.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: "n1"}}); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(f.r.Metrics.waiting); got != 0 {
		t.Errorf("leaving nodes held after the node was deleted: %v, want 0", got)
	}
}

func TestHoldCases(t *testing.T) {
	held := map[string]string{Annotation: annotationValue}
	tests := []struct {
		name             string
		enabled          bool
		ignoreAutoscaler bool
		node             *corev1.Node
		report           func(f *fixture)
		advance          time.Duration
		wantHeld         bool
		wantEv           string
	}{
		{name: "off: an earlier hold is removed", node: node("n", held, nil), wantHeld: false},
		{name: "off: nothing added", node: node("n", nil, nil), wantHeld: false},
		{name: "a node excluded from load balancers is not held", enabled: true, node: node("n", nil, map[string]string{lbmodel.ExcludeNodeLabel: ""}), wantHeld: false},
		{name: "a held node excluded from load balancers is released", enabled: true, node: node("n", held, map[string]string{lbmodel.ExcludeNodeLabel: ""}), wantHeld: false},
		{name: "cordon alone keeps the hold", enabled: true, node: func() *corev1.Node {
			n := node("n", held, nil)
			n.Spec.Unschedulable = true
			return n
		}(), wantHeld: true},
		{name: "leaving, an ebb lb that sends it traffic keeps it held", enabled: true, node: leavingNode(held), report: func(f *fixture) { f.setReport("n", "None", 0) }, wantHeld: true, wantEv: ReasonHeld},
		{name: "leaving, no load balancer lists it: released", enabled: true, node: leavingNode(held), wantHeld: false, wantEv: ReasonReleased},
		{name: "leaving, never held: nothing to do", enabled: true, node: leavingNode(nil), wantHeld: false},
		{name: "the autoscaler's taint counts even where it is ignored for admin state", enabled: true, ignoreAutoscaler: true, node: leavingNode(held), wantHeld: false, wantEv: ReasonReleased},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.enabled, tt.node)
			f.r.Model.IgnoreAutoscalerTaint = tt.ignoreAutoscaler
			if tt.report != nil {
				tt.report(f)
			}
			got, _, evs := f.reconcile("n")
			if got != tt.wantHeld {
				t.Errorf("held %v, want %v", got, tt.wantHeld)
			}
			if (tt.wantEv == "") != (len(evs) == 0) || tt.wantEv != "" && !strings.Contains(strings.Join(evs, "\n"), tt.wantEv) {
				t.Errorf("events %q, want %q", evs, tt.wantEv)
			}
		})
	}
}

// Connections that never end do not hold a node for ever: after the
// timeout the hold goes, with a warning that says how many were left.
func TestHoldTimesOut(t *testing.T) {
	f := newFixture(t, true, leavingNode(map[string]string{Annotation: annotationValue}))
	f.setReport("n", "Down", 2)
	if held, _, _ := f.reconcile("n"); !held {
		t.Fatal("not held at first")
	}
	f.clock.SetTime(f.clock.Now().Add(59 * time.Second))
	f.setReport("n", "Down", 2)
	if held, _, _ := f.reconcile("n"); !held {
		t.Fatal("released before the timeout")
	}
	f.clock.SetTime(f.clock.Now().Add(time.Second))
	f.setReport("n", "Down", 2)
	held, _, evs := f.reconcile("n")
	if held || len(evs) != 1 || !strings.Contains(evs[0], ReasonHoldTimedOut) || !strings.Contains(evs[0], "2 load-balancer connection(s)") {
		t.Fatalf("after the timeout: held %v, events %q", held, evs)
	}
	if got := testutil.ToFloat64(f.r.Metrics.releases.WithLabelValues("timeout")); got != 1 {
		t.Errorf("releases{timeout} = %v", got)
	}
}

func leavingNode(annotations map[string]string) *corev1.Node {
	n := node("n", annotations, nil)
	n.Spec.Taints = []corev1.Taint{{Key: lbmodel.TaintToBeDeleted, Value: "1764316800", Effect: corev1.TaintEffectNoSchedule}}
	return n
}

// An ebb lb pod that runs without a report is waited for only as long as
// a NodeMaintenance's drain waits for it (30 s), not to the timeout: once
// every reporting replica has the node Down with no connection, the hold
// goes, and the event names the pod.
func TestAnUnreportedReplicaHoldsOnlyShortly(t *testing.T) {
	silent := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: lbhost.DefaultNamespace, Name: "ebb-lb-silent", Labels: map[string]string{"app.kubernetes.io/name": lbhost.DaemonSet},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: lbhost.DaemonSet, UID: "ds", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: "lb-host"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	f := newFixture(t, true, leavingNode(map[string]string{Annotation: annotationValue}), silent)
	f.setReport("n", "Down", 0)
	if held, _, _ := f.reconcile("n"); !held {
		t.Fatal("released at once, while an ebb lb pod has not reported")
	}
	f.clock.SetTime(f.clock.Now().Add(29 * time.Second))
	f.setReport("n", "Down", 0)
	if held, _, _ := f.reconcile("n"); !held {
		t.Fatal("released before the 30 s an unreported replica is waited for")
	}
	f.clock.SetTime(f.clock.Now().Add(time.Second))
	f.setReport("n", "Down", 0)
	held, _, evs := f.reconcile("n")
	if held || len(evs) != 1 || !strings.Contains(evs[0], ReasonReleased) || !strings.Contains(evs[0], "ebb-lb-silent") {
		t.Fatalf("after 30 s: held %v, events %q; want released, naming the silent pod", held, evs)
	}
	if got := testutil.ToFloat64(f.r.Metrics.releases.WithLabelValues("drained")); got != 1 {
		t.Errorf("releases{drained} = %v", got)
	}

	// No replica reports at all: nothing says the node is drained, and the
	// hold waits for the timeout.
	h := newFixture(t, true, leavingNode(map[string]string{Annotation: annotationValue}), silent.DeepCopy())
	h.reconcile("n")
	h.clock.SetTime(h.clock.Now().Add(31 * time.Second))
	if held, _, _ := h.reconcile("n"); !held {
		t.Fatal("released after 30 s with no report at all")
	}

	// Connections the reporting replicas still see keep the hold.
	g := newFixture(t, true, leavingNode(map[string]string{Annotation: annotationValue}), silent.DeepCopy())
	g.setReport("n", "Down", 1)
	g.reconcile("n")
	g.clock.SetTime(g.clock.Now().Add(31 * time.Second))
	g.setReport("n", "Down", 1)
	if held, _, _ := g.reconcile("n"); !held {
		t.Fatal("released with a connection through the node")
	}
}
