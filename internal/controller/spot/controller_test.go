package spot

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

var epoch = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

// preemption is a PreemptScheduled Event created at epoch + second, as
// node-problem-detector writes it on AKS: in namespace default, from its
// custom plugin monitor, about the node by name with the node's name as
// its UID.
func preemption(name string, second int, node string) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: "default", Name: name, CreationTimestamp: metav1.NewTime(epoch.Add(time.Duration(second) * time.Second))},
		Reason:         lbmodel.ReasonPreemptScheduled,
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)},
		Source:         corev1.EventSource{Component: "custom-plugin-monitor", Host: node},
	}
}

// spotNode is a node created at epoch.
func spotNode(name string, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name + "-uid"), CreationTimestamp: metav1.NewTime(epoch)}, Spec: corev1.NodeSpec{Taints: taints}}
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}

// reconcileEvent reconciles one Event and returns the node as stored.
func reconcileEvent(t *testing.T, r *Reconciler, ev types.NamespacedName, node string) (*corev1.Node, ctrl.Result) {
	t.Helper()
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: ev})
	if err != nil {
		t.Fatal(err)
	}
	n := &corev1.Node{}
	if err := r.Client.Get(context.Background(), client.ObjectKey{Name: node}, n); err != nil {
		t.Fatal(err)
	}
	return n, res
}

// taintValue is the value of the node's NoSchedule taint key, or "" when
// it has none.
func taintValue(n *corev1.Node, key string) string {
	for _, tn := range n.Spec.Taints {
		if tn.Key == key && tn.Effect == corev1.TaintEffectNoSchedule {
			return tn.Value
		}
	}
	return ""
}

func drainingTaints(n *corev1.Node) int {
	count := 0
	for _, tn := range n.Spec.Taints {
		if tn.Key == lbmodel.TaintDraining && tn.Value == TaintValue && tn.Effect == corev1.TaintEffectNoSchedule {
			count++
		}
	}
	return count
}

func TestSpotPreemptionTaintsOnce(t *testing.T) {
	node := spotNode("n1")
	first := preemption("e1", 1, "n1")
	dup := preemption("e2", 2, "n1")
	c := fake.NewClientBuilder().WithScheme(newScheme()).WithObjects(node, first, dup).Build()
	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Client: c, Recorder: rec, TaintKey: lbmodel.TaintDraining}
	reconcile := func(ev string) *corev1.Node {
		n, _ := reconcileEvent(t, r, types.NamespacedName{Namespace: "default", Name: ev}, "n1")
		return n
	}

	if n := reconcile("e1"); drainingTaints(n) != 1 || n.Annotations[lbmodel.SpotHandledAnnotation] != "2026-11-22T00:00:01Z" {
		t.Fatalf("after the first event: taints %v, annotations %v", n.Spec.Taints, n.Annotations)
	}
	if len(rec.Events) != 1 {
		t.Fatalf("%d events after tainting, want 1", len(rec.Events))
	}
	<-rec.Events
	// Reconciling the same event again (a restart) changes nothing.
	if n := reconcile("e1"); drainingTaints(n) != 1 {
		t.Errorf("taints after a repeat: %v", n.Spec.Taints)
	}
	// A later duplicate event finds the taint and adds nothing.
	n := reconcile("e2")
	if drainingTaints(n) != 1 {
		t.Errorf("taints after a duplicate: %v", n.Spec.Taints)
	}
	if len(rec.Events) != 0 {
		t.Errorf("events for a duplicate: %d", len(rec.Events))
	}
	n.Spec.Taints = nil // the operator clears the taint
	if err := c.Update(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	// Events already handled do not taint again after the clear, nor after
	// a restart that replays them in any order.
	for _, ev := range []string{"e2", "e1"} {
		if n := reconcile(ev); drainingTaints(n) != 0 {
			t.Errorf("event %s, already acted on, tainted the node again: %v", ev, n.Spec.Taints)
		}
	}
	// A new preemption does.
	if err := c.Create(context.Background(), preemption("e4", 4, "n1")); err != nil {
		t.Fatal(err)
	}
	if n := reconcile("e4"); drainingTaints(n) != 1 {
		t.Errorf("a new preemption after the clear: taints %v", n.Spec.Taints)
	}
}

// Only an Event no namespace user can write, from an emitter the operator
// trusts, about this node rather than an earlier one of its name, marks a
// node leaving (issue 42 item 1, issue 50 item 1).
func TestSpotSignalIsTrustedOnlyFromTrustedEmitters(t *testing.T) {
	for _, tc := range []struct {
		name    string
		shape   func(*corev1.Event)
		tainted bool
		want    string // in the refusal's Event, when not tainted
	}{
		{"node-problem-detector on AKS: the node's name as its UID", func(*corev1.Event) {}, true, ""},
		{"a cloud's emitter with the Node's UID", func(e *corev1.Event) { e.InvolvedObject.UID = "n1-uid" }, true, ""},
		{"no UID", func(e *corev1.Event) { e.InvolvedObject.UID = "" }, true, ""},
		{"kube-system", func(e *corev1.Event) { e.Namespace = "kube-system" }, true, ""},
		{"events.k8s.io: the reporting controller", func(e *corev1.Event) {
			e.Source = corev1.EventSource{}
			e.ReportingController = "node-problem-detector"
		}, true, ""},
		{"a namespace editor's forgery: the Node named within their namespace", func(e *corev1.Event) {
			e.Namespace, e.InvolvedObject.Namespace = "team-a", "team-a"
		}, false, `it names the Node within namespace "team-a"`},
		{"written in a namespace that is not trusted", func(e *corev1.Event) { e.Namespace = "team-a" }, false, `it was written in namespace "team-a"`},
		{"an emitter not trusted", func(e *corev1.Event) { e.Source.Component = "my-script" }, false, `source "my-script"`},
		{"another Node's UID", func(e *corev1.Event) { e.InvolvedObject.UID = "older-node-uid" }, false, ""},
		{"by name, but created before this node", func(e *corev1.Event) { e.CreationTimestamp = metav1.NewTime(epoch.Add(-time.Minute)) }, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := preemption("e1", 1, "n1")
			tc.shape(ev)
			c := fake.NewClientBuilder().WithScheme(newScheme()).WithObjects(spotNode("n1"), ev).Build()
			rec := events.NewFakeRecorder(10)
			r := &Reconciler{Client: c, Recorder: rec, TaintKey: lbmodel.TaintDraining}
			n, _ := reconcileEvent(t, r, client.ObjectKeyFromObject(ev), "n1")
			if got := drainingTaints(n) == 1; got != tc.tainted {
				t.Fatalf("tainted %v, want %v: %v", got, tc.tainted, n.Spec.Taints)
			}
			if tc.want == "" {
				return
			}
			select {
			case e := <-rec.Events:
				if !strings.Contains(e, ReasonSpotSignalRefused) || !strings.Contains(e, tc.want) {
					t.Errorf("event %q, want %s saying %q", e, ReasonSpotSignalRefused, tc.want)
				}
			default:
				t.Errorf("no event says why the signal was refused")
			}
		})
	}
}

// Azure's key marks a node leaving only with the value spot-eviction: a
// node carrying it with another value is tainted, not taken as handled
// (issue 50 item 2).
func TestSpotTaintReplacesAnAzureValueThatIsNotLeaving(t *testing.T) {
	other := corev1.Taint{Key: lbmodel.TaintAzureDraining, Value: "upgrade", Effect: corev1.TaintEffectNoSchedule}
	ev := preemption("e1", 1, "n1")
	c := fake.NewClientBuilder().WithScheme(newScheme()).WithObjects(spotNode("n1", other), ev).Build()
	r := &Reconciler{Client: c, Recorder: events.NewFakeRecorder(10), TaintKey: lbmodel.TaintAzureDraining}
	n, _ := reconcileEvent(t, r, client.ObjectKeyFromObject(ev), "n1")
	if v := taintValue(n, lbmodel.TaintAzureDraining); v != TaintValue || len(n.Spec.Taints) != 1 {
		t.Fatalf("taints %v, want only %s=%s", n.Spec.Taints, lbmodel.TaintAzureDraining, TaintValue)
	}
	if leaving, _ := lbmodel.IsLeaving(n, lbmodel.Options{}); !leaving {
		t.Errorf("the node is not leaving: %v", n.Spec.Taints)
	}
}

// A taint another writer adds while the controller taints the node stays
// (issue 50 item 3): the patch is refused on the stale node, and the retry
// keeps both.
func TestSpotTaintKeepsATaintWrittenMeanwhile(t *testing.T) {
	ev := preemption("e1", 1, "n1")
	base := fake.NewClientBuilder().WithScheme(newScheme()).WithObjects(spotNode("n1"), ev).Build()
	outOfService := corev1.Taint{Key: lbmodel.TaintOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}
	raced := false
	c := interceptor.NewClient(base, interceptor.Funcs{Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
		if _, ok := obj.(*corev1.Node); ok && !raced {
			raced = true // another writer taints the node between the read and the patch
			n := &corev1.Node{}
			if err := cl.Get(ctx, client.ObjectKey{Name: "n1"}, n); err != nil {
				return err
			}
			n.Spec.Taints = append(n.Spec.Taints, outOfService)
			if err := cl.Update(ctx, n); err != nil {
				return err
			}
		}
		return cl.Patch(ctx, obj, patch, opts...)
	}})
	r := &Reconciler{Client: c, Recorder: events.NewFakeRecorder(10), TaintKey: lbmodel.TaintDraining}
	for range 2 { // the first try may be refused on the stale node
		_, _ = r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(ev)})
	}
	n := &corev1.Node{}
	if err := base.Get(context.Background(), client.ObjectKey{Name: "n1"}, n); err != nil {
		t.Fatal(err)
	}
	if drainingTaints(n) != 1 || len(n.Spec.Taints) != 2 {
		t.Errorf("taints %v, want the spot taint and %s", n.Spec.Taints, lbmodel.TaintOutOfService)
	}
}

// A preemption of the node that hosts the last serving ebb lb does not
// mark it leaving (every load-balancer address would go offline at once)
// and is looked at again; once another host serves, it does.
func TestSpotSignalKeepsTheLastLoadBalancerHost(t *testing.T) {
	now := epoch.Add(time.Hour)
	report := func(name, host string) *v1alpha1.LoadBalancerReport {
		ts := metav1.NewMicroTime(now)
		return &v1alpha1.LoadBalancerReport{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1alpha1.LoadBalancerReportStatus{
			Replica: name, HostNode: host, RenewTime: &ts, HeartbeatSeconds: 10}}
	}
	leaving := spotNode("n2", corev1.Taint{Key: lbmodel.TaintDraining, Value: "maintenance", Effect: corev1.TaintEffectNoSchedule})
	ev := preemption("e1", 1, "n1")
	c := fake.NewClientBuilder().WithScheme(newScheme()).WithObjects(spotNode("n1"), leaving, spotNode("n3"), ev, report("lb-1", "n1"), report("lb-2", "n2")).Build()
	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Client: c, Recorder: rec, TaintKey: lbmodel.TaintDraining, Now: func() time.Time { return now }}
	n, res := reconcileEvent(t, r, client.ObjectKeyFromObject(ev), "n1")
	if drainingTaints(n) != 0 {
		t.Fatalf("the last serving load-balancer host was marked leaving: %v", n.Spec.Taints)
	}
	if res.RequeueAfter == 0 {
		t.Errorf("the held preemption is not looked at again")
	}
	select {
	case e := <-rec.Events:
		if !strings.Contains(e, ReasonSpotEvictionHeld) || !strings.Contains(e, "lb-1 on n1") {
			t.Errorf("event %q, want %s naming lb-1 on n1", e, ReasonSpotEvictionHeld)
		}
	default:
		t.Errorf("no event says why the node was not marked leaving")
	}
	// Looked at again while nothing changed: held still, said once.
	if n, _ := reconcileEvent(t, r, client.ObjectKeyFromObject(ev), "n1"); drainingTaints(n) != 0 {
		t.Fatalf("marked leaving on a second look: %v", n.Spec.Taints)
	}
	select {
	case e := <-rec.Events:
		t.Errorf("the hold was said again at the next look: %q", e)
	default:
	}
	if err := c.Create(context.Background(), report("lb-3", "n3")); err != nil {
		t.Fatal(err)
	}
	if n, _ := reconcileEvent(t, r, client.ObjectKeyFromObject(ev), "n1"); drainingTaints(n) != 1 {
		t.Errorf("with another host serving, the node is not marked leaving: %v", n.Spec.Taints)
	}
}
