package spot

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

var epoch = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

// preemption is a PreemptScheduled Event created at epoch + second.
func preemption(name string, second int, node string, nodeUID types.UID) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: "default", Name: name, CreationTimestamp: metav1.NewTime(epoch.Add(time.Duration(second) * time.Second))},
		Reason:         lbmodel.ReasonPreemptScheduled,
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, UID: nodeUID},
	}
}

func TestSpotPreemptionTaintsOnce(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "node-uid"}}
	first := preemption("e1", 1, "n1", "node-uid")
	dup := preemption("e2", 2, "n1", "node-uid")
	stale := preemption("e3", 3, "n1", "older-node-uid")
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(node, first, dup, stale).Build()
	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Client: c, Recorder: rec, TaintKey: lbmodel.TaintDraining}
	reconcile := func(ev string) *corev1.Node {
		t.Helper()
		if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: ev}}); err != nil {
			t.Fatal(err)
		}
		n := &corev1.Node{}
		if err := c.Get(context.Background(), client.ObjectKey{Name: "n1"}, n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	drainingTaints := func(n *corev1.Node) int {
		count := 0
		for _, tn := range n.Spec.Taints {
			if tn.Key == lbmodel.TaintDraining && tn.Value == TaintValue && tn.Effect == corev1.TaintEffectNoSchedule {
				count++
			}
		}
		return count
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
	if n := reconcile("e2"); drainingTaints(n) != 1 {
		t.Errorf("taints after a duplicate: %v", n.Spec.Taints)
	}
	if len(rec.Events) != 0 {
		t.Errorf("events for a duplicate: %d", len(rec.Events))
	}
	// An event about an earlier node of the same name is ignored.
	n := reconcile("e3")
	n.Spec.Taints = nil // the operator clears the taint
	if err := c.Update(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	if n := reconcile("e3"); drainingTaints(n) != 0 {
		t.Errorf("an event about a replaced node tainted the new one: %v", n.Spec.Taints)
	}
	// Events already handled do not taint again after the clear, nor after
	// a restart that replays them in any order.
	for _, ev := range []string{"e2", "e1"} {
		if n := reconcile(ev); drainingTaints(n) != 0 {
			t.Errorf("event %s, already acted on, tainted the node again: %v", ev, n.Spec.Taints)
		}
	}
	// A new preemption does.
	if err := c.Create(context.Background(), preemption("e4", 4, "n1", "node-uid")); err != nil {
		t.Fatal(err)
	}
	if n := reconcile("e4"); drainingTaints(n) != 1 {
		t.Errorf("a new preemption after the clear: taints %v", n.Spec.Taints)
	}
}
