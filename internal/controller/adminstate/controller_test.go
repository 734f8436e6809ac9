package adminstate

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

func TestEventsOncePerTransition(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(node).WithIndex(&corev1.Node{}, InternalIPIndex, IndexInternalIPs).Build()
	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Client: c, Recorder: rec}
	step := func(taints ...string) []string {
		t.Helper()
		n := &corev1.Node{}
		if err := c.Get(context.Background(), types.NamespacedName{Name: "n1"}, n); err != nil {
			t.Fatal(err)
		}
		n.Spec.Taints = nil
		for _, k := range taints {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: k, Effect: corev1.TaintEffectNoSchedule})
		}
		if err := c.Update(context.Background(), n); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: "n1"}}); err != nil {
			t.Fatal(err)
		}
		var out []string
		for len(rec.Events) > 0 {
			out = append(out, <-rec.Events)
		}
		return out
	}
	if evs := step(); len(evs) != 0 {
		t.Errorf("a healthy node got events: %q", evs)
	}
	if evs := step(lbmodel.TaintOutOfService); len(evs) != 1 || !strings.Contains(evs[0], ReasonDown) || !strings.Contains(evs[0], lbmodel.TaintOutOfService) {
		t.Errorf("taint: events %q", evs)
	}
	if evs := step(lbmodel.TaintOutOfService, lbmodel.TaintDraining); len(evs) != 0 {
		t.Errorf("a second leaving taint repeated the event: %q", evs)
	}
	if evs := step(); len(evs) != 1 || !strings.Contains(evs[0], ReasonNone) {
		t.Errorf("untaint: events %q", evs)
	}
	if evs := step(corev1.TaintNodeUnschedulable); len(evs) != 0 {
		t.Errorf("cordon reported a transition: %q", evs)
	}
}

// A node whose InternalIP another, preferred, node gives too gets one
// Warning naming both, whichever of the two is reconciled, and not again
// at every update.
func TestDuplicateAddressWarnsOnceOnTheNodeLeftOut(t *testing.T) {
	withIP := func(name string, ready bool) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}}}}
		if ready {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		}
		return n
	}
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(withIP("old", false), withIP("new", true)).WithIndex(&corev1.Node{}, InternalIPIndex, IndexInternalIPs).Build()
	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Client: c, Recorder: rec}
	for _, name := range []string{"new", "old", "new", "old"} {
		if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for len(rec.Events) > 0 {
		got = append(got, <-rec.Events)
	}
	if len(got) != 1 || !strings.Contains(got[0], ReasonDuplicateAddress) || !strings.Contains(got[0], "given by node new too (nodes new, old)") {
		t.Errorf("events %q, want one %s naming new and old", got, ReasonDuplicateAddress)
	}
}

// A Node event reads only the Nodes that give one of its addresses, from
// the cache's index, not every Node of the cluster: with thousands of
// nodes reporting, a full list per event was O(nodes²).
func TestANodeEventReadsOnlyItsAddressesNodes(t *testing.T) {
	withIP := func(name, ip string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
	}
	var lists []string
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).
		WithObjects(withIP("old", "10.0.0.9"), withIP("new", "10.0.0.9"), withIP("other", "10.0.0.99")).
		WithIndex(&corev1.Node{}, InternalIPIndex, IndexInternalIPs).
		WithInterceptorFuncs(interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			o := &client.ListOptions{}
			o.ApplyOptions(opts)
			lists = append(lists, fmt.Sprint(o.FieldSelector))
			return c.List(ctx, list, opts...)
		}}).Build()
	r := &Reconciler{Client: c, Recorder: events.NewFakeRecorder(10)}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: "old"}}); err != nil {
		t.Fatal(err)
	}
	if len(lists) != 1 || lists[0] != InternalIPIndex+"=10.0.0.9" {
		t.Errorf("lists %q, want one, by the index, of 10.0.0.9", lists)
	}
}
