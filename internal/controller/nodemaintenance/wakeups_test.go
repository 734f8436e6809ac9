package nodemaintenance

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// onNodes makes a maintenance in stage that selects the nodes by name.
func onNodes(name string, stage v1alpha1.NodeMaintenanceStage, deleting bool, nodes ...string) *v1alpha1.NodeMaintenance {
	nm := &v1alpha1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.NodeMaintenanceSpec{
		Stage: stage,
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{
			Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: nodes,
		}}}}},
	}}
	if deleting {
		now := metav1.Now()
		nm.DeletionTimestamp, nm.Finalizers = &now, []string{v1alpha1.MaintenanceCompletionFinalizer}
	}
	return nm
}

func woken(f handler.MapFunc, obj client.Object) []string {
	var out []string
	for _, req := range f(context.Background(), obj) {
		out = append(out, req.Name)
	}
	slices.Sort(out)
	return out
}

// Events wake only the maintenances that have work to do on them: nodes
// wake Cordon and Drain, pods (and Evacuations, reports) only Drain, and
// only the maintenances of the event's node; Idle and Complete
// maintenances sleep unless being deleted.
func TestEventsWakeOnlyMaintenancesWithWorkToDo(t *testing.T) {
	n1 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	n2 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}
	// "left" no longer selects n2 but its status still lists it: n2 must
	// be released, so n2's events wake it.
	left := onNodes("left", v1alpha1.Drain, false, "n3")
	left.Status.NodeStatuses = []v1alpha1.NodeMaintenanceNodeStatus{{NodeRef: v1alpha1.NodeReference{Name: "n2"}}}
	// "queued" waits for a drain slot: any node may free one.
	queued := onNodes("queued", v1alpha1.Drain, false, "n3")
	queued.Status.StageStatuses = []v1alpha1.StageStatus{{Name: v1alpha1.Drain}}
	pod := func(name, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: corev1.PodSpec{NodeName: node}}
	}
	evacuation := func(podName string) *v1alpha1.Evacuation {
		return &v1alpha1.Evacuation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "e-" + podName},
			Spec: v1alpha1.EvacuationSpec{PodRef: v1alpha1.PodReference{Name: podName}}}
	}
	r, _, _ := newFakeReconciler(t, n1, n2, pod("on-n1", "n1"), pod("on-n2", "n2"), left, queued,
		onNodes("idle", v1alpha1.Idle, false, "n1"), onNodes("cordon", v1alpha1.Cordon, false, "n1"),
		onNodes("drain", v1alpha1.Drain, false, "n1"), onNodes("drain-n2", v1alpha1.Drain, false, "n2"),
		onNodes("complete", v1alpha1.Complete, false, "n1"), onNodes("deleting", v1alpha1.Complete, true, "n1"))
	active := []v1alpha1.NodeMaintenanceStage{v1alpha1.Cordon, v1alpha1.Drain}
	for _, tc := range []struct {
		what string
		f    handler.MapFunc
		obj  client.Object
		want []string
	}{
		{"a maintenance", r.maintenancesIn(active...), nil, []string{"cordon", "deleting", "drain", "drain-n2", "left", "queued"}},
		{"a load-balancer report", r.maintenancesIn(v1alpha1.Drain), nil, []string{"deleting", "drain", "drain-n2", "left", "queued"}},
		{"node n1", r.maintenancesOf(nodeOfNode, true, active...), n1, []string{"cordon", "deleting", "drain", "queued"}},
		{"node n2", r.maintenancesOf(nodeOfNode, true, active...), n2, []string{"drain-n2", "left", "queued"}},
		{"a node no maintenance knows", r.maintenancesOf(nodeOfNode, true, active...), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gone"}}, []string{"queued"}},
		{"a pod on n1", r.maintenancesOf(nodeOfPod, false, v1alpha1.Drain), pod("p", "n1"), []string{"deleting", "drain"}},
		{"a pod on n2", r.maintenancesOf(nodeOfPod, false, v1alpha1.Drain), pod("p", "n2"), []string{"drain-n2", "left"}},
		{"a pending pod", r.maintenancesOf(nodeOfPod, false, v1alpha1.Drain), pod("p", ""), nil},
		{"an Evacuation of a pod on n1", r.maintenancesOf(r.nodeOfEvacuation, false, v1alpha1.Drain), evacuation("on-n1"), []string{"deleting", "drain"}},
		{"an Evacuation of a pod on n2", r.maintenancesOf(r.nodeOfEvacuation, false, v1alpha1.Drain), evacuation("on-n2"), []string{"drain-n2", "left"}},
		{"an Evacuation whose pod is gone", r.maintenancesOf(r.nodeOfEvacuation, false, v1alpha1.Drain), evacuation("gone"), nil},
	} {
		if got := woken(tc.f, tc.obj); !slices.Equal(got, tc.want) {
			t.Errorf("%s wakes %v, want %v", tc.what, got, tc.want)
		}
	}
}
