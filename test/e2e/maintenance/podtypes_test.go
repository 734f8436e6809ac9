package maintenance_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// The default drain plan evacuates ordinary pods first, DaemonSet pods
// only once they are gone (and the draining taint keeps the DaemonSet
// controller from putting them back), and reports static pods, which the
// API cannot stop, without waiting for them.
func TestDrainOrderByPodType(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	node := cluster.Nodes[1].Name
	pinnedApp(t, ctx, ns, "web", node, "", 1)

	ds := agentDaemonSet(t, ctx, ns)
	// A DaemonSet that tolerates every taint would come straight back:
	// reported, not fought.
	tolerant := ds.DeepCopy()
	tolerant.Name = "tolerant"
	tolerant.Spec.Selector.MatchLabels = map[string]string{"app": "tolerant"}
	tolerant.Spec.Template.Labels = map[string]string{"app": "tolerant"}
	tolerant.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	if _, err := cluster.Client.AppsV1().DaemonSets(ns).Create(ctx, tolerant, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	agentOn := func(ctx context.Context) int {
		n := 0
		for _, p := range appPods(t, ctx, ns, "agent") {
			if p.Spec.NodeName == node && p.DeletionTimestamp == nil {
				n++
			}
		}
		return n
	}
	eventually(t, ctx, time.Minute, "the DaemonSet's pod on "+node, func(ctx context.Context) (bool, string) {
		return agentOn(ctx) == 1, fmt.Sprintf("%d", agentOn(ctx))
	})
	// A static pod, run by the node's kubelet from a manifest file; its
	// mirror pod in the API is what the drain sees.
	static := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "static", Labels: map[string]string{"app": "static"}},
		Spec:       cluster.AppDeployment(ns, "static", 1).Spec.Template.Spec,
	}
	if err := cluster.WriteStaticPod(node, static); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.RemoveStaticPod(node, static.Name); err != nil {
			t.Error(err)
		}
	})
	eventually(t, ctx, time.Minute, "the static pod's mirror on "+node, func(ctx context.Context) (bool, string) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "static-"+node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		_, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]
		return mirror, fmt.Sprintf("annotations %v", p.Annotations)
	})

	// The budget holds the ordinary pod on the node: with no evacuator,
	// ebb's Evacuation controller evicts it at once, and agnhost exits
	// within a second of SIGTERM, so without the budget the drain may
	// rightly be at the DaemonSet pods before the check below (CI's stop
	// 63 saw 2 Evacuations there).
	removeBudget := pdb(t, ctx, ns, "web", 1)
	create(t, ctx, admin, maintenance("podtypes", v1alpha1.Drain, byName(node)))
	webPod := appPods(t, ctx, ns, "web")[0].Name
	eventually(t, ctx, 20*time.Second, "an Evacuation of the ordinary pod only", func(ctx context.Context) (bool, string) {
		evs := evacuations(t, ctx, ns)
		_, web := evs[webPod]
		return web && len(evs) == 1, fmt.Sprintf("Evacuations %v", evacuationNames(t, ctx, ns))
	})
	time.Sleep(2 * time.Second) // what the controller does next with the same pods
	if evs := evacuations(t, ctx, ns); len(evs) != 1 {
		t.Fatalf("Evacuations %v while the ordinary pod %s is there, want its own only (DaemonSet pods go last)", evacuationNames(t, ctx, ns), webPod)
	}

	removeBudget()
	evacuate(t, ctx, ns)
	podsGoneFrom(t, ctx, ns, "web", node)
	eventually(t, ctx, 30*time.Second, "the DaemonSet pod's Evacuation next", func(ctx context.Context) (bool, string) {
		for _, e := range evacuations(t, ctx, ns) {
			if strings.HasPrefix(e.Spec.PodRef.Name, "agent-") {
				return true, ""
			}
		}
		return false, "none"
	})
	evacuate(t, ctx, ns)
	eventually(t, ctx, time.Minute, "Drained, with the static pod reported", func(ctx context.Context) (bool, string) {
		nm := getNM(t, ctx, "podtypes")
		msg := nodeStatus(nm, node).DrainMessage
		return meta.IsStatusConditionTrue(nm.Status.Conditions, v1alpha1.DrainedCondition) && strings.Contains(msg, "1 static pod(s) cannot be evacuated through the API") &&
				strings.Contains(msg, "tolerant tolerate the draining taint"),
			fmt.Sprintf("message %q", msg)
	})
	for _, e := range evacuations(t, ctx, ns) {
		if strings.HasPrefix(e.Spec.PodRef.Name, "tolerant-") {
			t.Errorf("the tolerant DaemonSet's pod %s was evacuated", e.Spec.PodRef.Name)
		}
	}
	time.Sleep(2 * time.Second)
	if n := agentOn(ctx); n != 0 {
		t.Errorf("the DaemonSet controller put %d pod(s) back on the draining node", n)
	}
}

// A node that joins a drain under way (issue 41 item 3), here by a label
// the maintenance's selector takes, starts at the plan's first entry: its
// ordinary pod is evacuated first and its DaemonSet pod (say, the CNI
// agent the ordinary pod needs) only after, although the drain of the
// first node had reached the DaemonSet entry.
func TestANodeJoiningADrainStartsFromTheFirstEntry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	first, joining := cluster.Nodes[1].Name, cluster.Nodes[2].Name
	const label = "e2e.ebb.dev/join"
	setLabel := func(node, value string) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, label, value)
		if _, err := cluster.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, n := range []string{first, joining} {
			patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, label)
			_, _ = cluster.Client.CoreV1().Nodes().Patch(context.Background(), n, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		}
	})

	agentDaemonSet(t, ctx, ns)
	agentOn := func(ctx context.Context, node string) string {
		for _, p := range appPods(t, ctx, ns, "agent") {
			if p.Spec.NodeName == node && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				return p.Name
			}
		}
		return ""
	}
	for _, n := range []string{first, joining} {
		eventually(t, ctx, time.Minute, "the DaemonSet's pod on "+n, func(ctx context.Context) (bool, string) {
			return agentOn(ctx, n) != "", "none running"
		})
	}
	firstAgent, joiningAgent := agentOn(ctx, first), agentOn(ctx, joining)
	pinnedApp(t, ctx, ns, "web", joining, "", 1)
	webPod := appPods(t, ctx, ns, "web")[0].Name

	setLabel(first, strconv.Quote(ns))
	create(t, ctx, admin, maintenance("joining", v1alpha1.Drain, &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: label, Operator: corev1.NodeSelectorOpIn, Values: []string{ns}}},
	}}}))
	// The maintenance's own entry, as its status records it, must be past
	// the ordinary pods: an Evacuation of the DaemonSet pod alone does not
	// say that the status was written (a pass that fails after creating
	// it records nothing, until a later pass; one did when a previous
	// test's namespace was still terminating, which the controller now
	// passes over: unit TestAPodInATerminatingNamespaceHoldsNothingUp).
	eventually(t, ctx, time.Minute, "the drain of "+first+" at its DaemonSet pod", func(ctx context.Context) (bool, string) {
		_, ok := evacuations(t, ctx, ns)[firstAgent]
		nm := getNM(t, ctx, "joining")
		at := int(nm.Status.DrainPlanIndex)
		past := at < len(nm.Spec.DrainPlan) && nm.Spec.DrainPlan[at].PodType != v1alpha1.Default
		return ok && past, fmt.Sprintf("maintenance at entry %d, nodes %s, Evacuations %v", at, drainProgress(nm), evacuationNames(t, ctx, ns))
	})

	// The budget holds the ordinary pod on the joining node (ebb's
	// Evacuation controller would evict it at once), so that what the
	// drain does meanwhile can be seen.
	removeBudget := pdb(t, ctx, ns, "web", 1)
	setLabel(joining, strconv.Quote(ns))
	eventually(t, ctx, 30*time.Second, joining+" joining at the first entry, its ordinary pod evacuated", func(ctx context.Context) (bool, string) {
		nm := getNM(t, ctx, "joining")
		st := nodeStatus(nm, joining)
		_, web := evacuations(t, ctx, ns)[webPod]
		return web && st.DrainPlanIndex != nil && *st.DrainPlanIndex == 0 && strings.Contains(st.DrainMessage, "joined the drain late"),
			fmt.Sprintf("maintenance at entry %d, nodes %s, Evacuations %v", nm.Status.DrainPlanIndex, drainProgress(nm), evacuationNames(t, ctx, ns))
	})
	time.Sleep(2 * time.Second) // what the controller does next with the same pods
	if _, ok := evacuations(t, ctx, ns)[joiningAgent]; ok {
		t.Fatalf("the DaemonSet pod on the joining node %s was evacuated while its ordinary pod was still there", joining)
	}

	// The budget gone, the ordinary pod leaves, and only then the
	// DaemonSet pod's Evacuation comes.
	removeBudget()
	evacuate(t, ctx, ns)
	eventually(t, ctx, time.Minute, "the joining node's DaemonSet pod evacuated after its ordinary pod left", func(ctx context.Context) (bool, string) {
		if _, ok := evacuations(t, ctx, ns)[joiningAgent]; !ok {
			return false, fmt.Sprintf("Evacuations %v, status %+v", evacuationNames(t, ctx, ns), nodeStatus(getNM(t, ctx, "joining"), joining))
		}
		for _, p := range appPods(t, ctx, ns, "web") {
			// A pod whose containers have ended (Succeeded, Failed) is
			// gone for the drain, as for kubectl drain.
			if p.Name == webPod && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				t.Fatalf("the DaemonSet pod on %s was evacuated while its ordinary pod %s was still there (%s)", joining, webPod, p.Status.Phase)
			}
		}
		return true, ""
	})
}

func evacuationNames(t *testing.T, ctx context.Context, ns string) []string {
	var out []string
	for name := range evacuations(t, ctx, ns) {
		out = append(out, name)
	}
	return out
}

// drainProgress shows each node's entry and message, for a failure's
// message.
func drainProgress(nm *v1alpha1.NodeMaintenance) string {
	var b strings.Builder
	for _, ns := range nm.Status.NodeStatuses {
		at := "none"
		if ns.DrainPlanIndex != nil {
			at = strconv.Itoa(int(*ns.DrainPlanIndex))
		}
		fmt.Fprintf(&b, "[%s: entry %s, targets %v, %q] ", ns.NodeRef.Name, at, ns.DrainTargets, ns.DrainMessage)
	}
	return b.String()
}
