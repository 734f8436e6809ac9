package maintenance_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// pinnedApp runs replicas of the echo app on node, with a priority class
// ("" for none), and waits for them.
func pinnedApp(t *testing.T, ctx context.Context, ns, name, node, priorityClass string, replicas int32) {
	t.Helper()
	dep := cluster.AppDeployment(ns, name, replicas)
	dep.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	dep.Spec.Template.Spec.PriorityClassName = priorityClass
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitDeploymentAvailable(ctx, ns, name, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// agentDaemonSet creates the DaemonSet "agent" of the test app (a pod on
// every node, app=agent) and returns it.
func agentDaemonSet(t *testing.T, ctx context.Context, ns string) *appsv1.DaemonSet {
	t.Helper()
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agent"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}},
			Template: cluster.AppDeployment(ns, "agent", 1).Spec.Template},
	}
	if _, err := cluster.Client.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ds
}

// priorityClass creates a PriorityClass for the test.
func priorityClass(t *testing.T, ctx context.Context, name string, value int32) {
	t.Helper()
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
	if _, err := cluster.Client.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// appPods lists an app's live pods.
func appPods(t *testing.T, ctx context.Context, ns, app string) []corev1.Pod {
	t.Helper()
	list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// evacuations lists the Evacuations of a namespace by pod name.
func evacuations(t *testing.T, ctx context.Context, ns string) map[string]v1alpha1.Evacuation {
	t.Helper()
	admin, _ := newClient(t, "")
	var list v1alpha1.EvacuationList
	if err := admin.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	out := map[string]v1alpha1.Evacuation{}
	for _, e := range list.Items {
		out[e.Spec.PodRef.Name] = e
	}
	return out
}

// evacuate plays an evacuator: it evicts, through the Eviction API with a
// UID precondition, the pods of a namespace that have an Evacuation.
func evacuate(t *testing.T, ctx context.Context, ns string) {
	t.Helper()
	for _, e := range evacuations(t, ctx, ns) {
		ev := &policyv1.Eviction{
			ObjectMeta:    metav1.ObjectMeta{Namespace: ns, Name: e.Spec.PodRef.Name},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &e.Spec.PodRef.UID}},
		}
		err := cluster.Client.PolicyV1().Evictions(ns).Evict(ctx, ev)
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			t.Fatalf("evicting %s: %v", e.Spec.PodRef.Name, err)
		}
	}
}

// podsGoneFrom waits until no pod of the app is on node.
func podsGoneFrom(t *testing.T, ctx context.Context, ns, app, node string) {
	t.Helper()
	eventually(t, ctx, time.Minute, "the pods of "+app+" to leave "+node, func(ctx context.Context) (bool, string) {
		n := 0
		for _, p := range appPods(t, ctx, ns, app) {
			if p.Spec.NodeName == node {
				n++
			}
		}
		return n == 0, fmt.Sprintf("%d left", n)
	})
}

func getNode(t *testing.T, ctx context.Context, name string) *corev1.Node {
	t.Helper()
	n, err := cluster.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func setUnschedulable(t *testing.T, ctx context.Context, name string, on bool) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Unschedulable = on
		_, err = cluster.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func nodeCondition(n *corev1.Node, typ string) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if string(c.Type) == typ {
			return c.Status
		}
	}
	return ""
}

func hasTaint(n *corev1.Node, key, value string) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key && t.Value == value })
}

// nodeStatus returns a maintenance's status for one node.
func nodeStatus(nm *v1alpha1.NodeMaintenance, node string) v1alpha1.NodeMaintenanceNodeStatus {
	for _, s := range nm.Status.NodeStatuses {
		if s.NodeRef.Name == node {
			return s
		}
	}
	return v1alpha1.NodeMaintenanceNodeStatus{}
}

// maintenanceEvents lists the reasons of a maintenance's events.
func maintenanceEvents(t *testing.T, ctx context.Context, name string) []string {
	t.Helper()
	list, err := cluster.Client.EventsV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "regarding.kind=NodeMaintenance,regarding.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Reason)
	}
	return out
}

// pdb protects an app with a PodDisruptionBudget of minAvailable and
// returns a function that deletes it.
func pdb(t *testing.T, ctx context.Context, ns, app string, minAvailable int32) func() {
	t.Helper()
	min := intstr.FromInt32(minAvailable)
	b := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: app},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &min, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
	}
	if _, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The disruption controller must have seen it, or evictions get 429
	// for a budget "still being processed".
	eventually(t, ctx, 30*time.Second, "PodDisruptionBudget "+app+" observed", func(ctx context.Context) (bool, string) {
		got, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, app, metav1.GetOptions{})
		return err == nil && got.Status.ObservedGeneration >= got.Generation, fmt.Sprint(err)
	})
	return func() {
		if err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Delete(context.Background(), app, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting PodDisruptionBudget %s: %v", app, err)
		}
	}
}
