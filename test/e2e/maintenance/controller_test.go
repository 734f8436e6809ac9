package maintenance_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// Cordon keeps the nodes unschedulable, cordoning again (with an event)
// when someone uncordons one; Complete uncordons only what ebb cordoned.
func TestCordonFightsBackAndCompleteUncordonsOnlyItsOwn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	mine, users := cluster.Nodes[2].Name, cluster.Nodes[1].Name
	setUnschedulable(t, ctx, users, true)
	defer setUnschedulable(t, context.Background(), users, false)

	create(t, ctx, admin, maintenance("cordon", v1alpha1.Cordon, byName(mine, users)))
	eventually(t, ctx, 20*time.Second, "both nodes cordoned for maintenance", func(ctx context.Context) (bool, string) {
		a, b := getNode(t, ctx, mine), getNode(t, ctx, users)
		return a.Spec.Unschedulable && a.Annotations[v1alpha1.CordonAnnotation] == "ebb" &&
				b.Spec.Unschedulable && b.Annotations[v1alpha1.CordonAnnotation] == "preexisting" &&
				nodeCondition(a, v1alpha1.NodeConditionMaintenanceInProgress) == corev1.ConditionTrue,
			fmt.Sprintf("%s: %v %v; %s: %v %v", mine, a.Spec.Unschedulable, a.Annotations, users, b.Spec.Unschedulable, b.Annotations)
	})

	setUnschedulable(t, ctx, mine, false)
	eventually(t, ctx, 20*time.Second, "the uncordoned node cordoned again, with an event", func(ctx context.Context) (bool, string) {
		n := getNode(t, ctx, mine)
		return n.Spec.Unschedulable && slices.Contains(maintenanceEvents(t, ctx, "cordon"), v1alpha1.ReasonRecordoned), fmt.Sprintf("unschedulable %v", n.Spec.Unschedulable)
	})

	if err := setStage(ctx, admin, "cordon", v1alpha1.Complete); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 20*time.Second, "ebb's cordon lifted, the user's kept", func(ctx context.Context) (bool, string) {
		a, b := getNode(t, ctx, mine), getNode(t, ctx, users)
		return !a.Spec.Unschedulable && b.Spec.Unschedulable && a.Annotations[v1alpha1.CordonAnnotation] == "" &&
				nodeCondition(a, v1alpha1.NodeConditionMaintenanceInProgress) == corev1.ConditionFalse,
			fmt.Sprintf("%s unschedulable %v, %s unschedulable %v", mine, a.Spec.Unschedulable, users, b.Spec.Unschedulable)
	})
}

// Drain cordons and taints the node, creates an Evacuation for each of its
// pods; once they leave (here the test is the evacuator and uses the
// Eviction API) the maintenance and the node say Drained. Deleting the
// maintenance completes it: taint and cordon go, Evacuations are
// withdrawn, and the finalizer lets it go.
func TestDrainThenDeleteCompletes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	node := cluster.Nodes[0].Name
	pinnedApp(t, ctx, ns, "web", node, "", 2)
	// The budget holds both pods while the test looks at the drain under
	// way: ebb's Evacuation controller evicts a pod with no evacuator at
	// once, and a pod gone before the metrics are read made this test
	// fail by chance.
	removeBudget := pdb(t, ctx, ns, "web", 2)

	nm := maintenance("drain", v1alpha1.Drain, byName(node))
	if err := admin.Create(ctx, nm); err != nil {
		t.Fatal(err)
	}
	// The test deletes it itself; this is for a test that stops early,
	// which would leave the node cordoned for every test after it.
	t.Cleanup(func() { deleteAndWait(t, context.Background(), nm.Name) })
	eventually(t, ctx, 20*time.Second, "the node cordoned and tainted draining, an Evacuation per pod", func(ctx context.Context) (bool, string) {
		n := getNode(t, ctx, node)
		evs := evacuations(t, ctx, ns)
		return n.Spec.Unschedulable && hasTaint(n, lbmodel.TaintDraining, "maintenance") && len(evs) == 2,
			fmt.Sprintf("unschedulable %v, taints %v, %d Evacuations", n.Spec.Unschedulable, n.Spec.Taints, len(evs))
	})
	for _, e := range evacuations(t, ctx, ns) {
		if !slices.Contains(e.Finalizers, v1alpha1.InstigatorFinalizer) || e.Spec.ProgressDeadlineSeconds != 1800 || e.Labels["app"] != "web" {
			t.Errorf("Evacuation %s: finalizers %v, deadline %d, labels %v", e.Name, e.Finalizers, e.Spec.ProgressDeadlineSeconds, e.Labels)
		}
	}
	got := getNM(t, ctx, "drain")
	if s := nodeStatus(got, node); s.PodsEvacuating != 2 || len(s.DrainTargets) == 0 || !strings.HasPrefix(s.DrainMessage, "Evacuating") {
		t.Errorf("node status %+v", s)
	}
	if meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.DrainedCondition) {
		t.Error("Drained before any pod left")
	}
	out, err := exec.CommandContext(ctx, filepath.Join(cluster.BinDir, "kubectl"), "--kubeconfig", cluster.Kubeconfig, "get", "nm", "drain").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "STAGE") || !strings.Contains(string(out), "DRAINED") || !regexp.MustCompile(`drain\s+Drain\s+1\s+False\s+e2e drain`).Match(out) {
		t.Errorf("kubectl get nm: %v\n%s", err, out)
	}
	if m := controllerMetrics(t); !strings.Contains(m, `ebb_nodemaintenance_maintenances{stage="Drain"} 1`) || !strings.Contains(m, `ebb_nodemaintenance_pods{nodemaintenance="drain",state="evacuating"} 2`) {
		t.Errorf("controller metrics lack the maintenance:\n%s", grepLines(m, "ebb_nodemaintenance"))
	}

	removeBudget()
	evacuate(t, ctx, ns)
	podsGoneFrom(t, ctx, ns, "web", node)
	eventually(t, ctx, 30*time.Second, "Drained on the maintenance and the node", func(ctx context.Context) (bool, string) {
		nm := getNM(t, ctx, "drain")
		n := getNode(t, ctx, node)
		return meta.IsStatusConditionTrue(nm.Status.Conditions, v1alpha1.DrainedCondition) &&
				nodeCondition(n, v1alpha1.NodeConditionDrained) == corev1.ConditionTrue &&
				nodeCondition(n, v1alpha1.NodeConditionDrainInProgress) == corev1.ConditionFalse &&
				strings.HasPrefix(nodeStatus(nm, node).DrainMessage, "Drained"),
			fmt.Sprintf("conditions %v, node status %+v", nm.Status.Conditions, nodeStatus(nm, node))
	})
	stages := getNM(t, ctx, "drain").Status.StageStatuses
	if len(stages) != 1 || stages[0].Name != v1alpha1.Drain || stages[0].StartTimestamp == nil {
		t.Errorf("stage statuses %+v", stages)
	}

	deleteAndWait(t, ctx, "drain")
	n := getNode(t, ctx, node)
	if n.Spec.Unschedulable || hasTaint(n, lbmodel.TaintDraining, "maintenance") || nodeCondition(n, v1alpha1.NodeConditionMaintenanceInProgress) == corev1.ConditionTrue {
		t.Errorf("after completion: unschedulable %v, taints %v, conditions %v", n.Spec.Unschedulable, n.Spec.Taints, n.Status.Conditions)
	}
	eventually(t, ctx, 20*time.Second, "the Evacuations withdrawn", func(ctx context.Context) (bool, string) {
		evs := evacuations(t, ctx, ns)
		return len(evs) == 0, fmt.Sprintf("%d left", len(evs))
	})
}

// Two maintenances on one node: the least advanced plan limits the node
// (KEP-4212's drain targets), so higher-priority pods are not evacuated
// until the lower ones are gone, and the statuses say why.
// PodDisruptionBudgets hold each step still long enough to look at it.
func TestOverlappingMaintenances(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	x, y := cluster.Nodes[0].Name, cluster.Nodes[1].Name
	priorityClass(t, ctx, "e2e-low", 100)
	priorityClass(t, ctx, "e2e-high", 1000)
	pinnedApp(t, ctx, ns, "low", x, "e2e-low", 1)
	pinnedApp(t, ctx, ns, "high", x, "e2e-high", 1)
	lowPod, highPod := appPods(t, ctx, ns, "low")[0].Name, appPods(t, ctx, ns, "high")[0].Name
	releaseLow := pdb(t, ctx, ns, "low", 1)
	releaseHigh := pdb(t, ctx, ns, "high", 1)
	defer releaseHigh()

	a := maintenance("overlap-a", v1alpha1.Drain, byName(x))
	a.Spec.DrainPlan = []v1alpha1.DrainPlanEntry{{PodType: v1alpha1.Default, PodPriority: 100}}
	create(t, ctx, admin, a)
	time.Sleep(1100 * time.Millisecond) // creation timestamps have whole seconds: b is newer
	b := maintenance("overlap-b", v1alpha1.Drain, byName(x, y))
	b.Spec.DrainPlan = []v1alpha1.DrainPlanEntry{{PodType: v1alpha1.Default, PodPriority: 1000}}
	create(t, ctx, admin, b)

	eventually(t, ctx, 20*time.Second, "only the low-priority pod evacuated, b limited by a on "+x, func(ctx context.Context) (bool, string) {
		evs := evacuations(t, ctx, ns)
		s := nodeStatus(getNM(t, ctx, "overlap-b"), x)
		_, low := evs[lowPod]
		return low && len(evs) == 1 && strings.HasPrefix(s.DrainMessage, "Evacuating (limited by overlap-a)") && evs[lowPod].Status.FailedEvictionCounter > 0,
			fmt.Sprintf("%d Evacuations, b on %s: %q", len(evs), x, s.DrainMessage)
	})
	if s := nodeStatus(getNM(t, ctx, "overlap-b"), y); !strings.HasPrefix(s.DrainMessage, "Waiting for node "+x+".") {
		t.Errorf("b on %s: %q", y, s.DrainMessage)
	}

	releaseLow()
	eventually(t, ctx, 40*time.Second, "the high-priority pod evacuated next, a limited by b", func(ctx context.Context) (bool, string) {
		evs := evacuations(t, ctx, ns)
		s := nodeStatus(getNM(t, ctx, "overlap-a"), x)
		_, high := evs[highPod]
		_, low := evs[lowPod]
		return high && !low && strings.HasPrefix(s.DrainMessage, "Evacuating (limited by overlap-b)"), fmt.Sprintf("high %v low %v, a on %s: %q", high, low, x, s.DrainMessage)
	})
	releaseHigh()
	eventually(t, ctx, 60*time.Second, "both maintenances Drained", func(ctx context.Context) (bool, string) {
		na, nb := getNM(t, ctx, "overlap-a"), getNM(t, ctx, "overlap-b")
		return meta.IsStatusConditionTrue(na.Status.Conditions, v1alpha1.DrainedCondition) && meta.IsStatusConditionTrue(nb.Status.Conditions, v1alpha1.DrainedCondition),
			fmt.Sprintf("a %v / b %v", na.Status.NodeStatuses, nb.Status.NodeStatuses)
	})
	assertNoWriteLoop(t, ctx, x, "overlap-a", "overlap-b")
}

// assertNoWriteLoop checks that, once steady, the maintenances are not
// written again and ebb does not rewrite the node's maintenance
// conditions (each write of one sets its lastHeartbeatTime): two
// maintenances on one node used to swap their order in the condition
// message, and each write woke every maintenance.
func assertNoWriteLoop(t *testing.T, ctx context.Context, node string, maintenances ...string) {
	t.Helper()
	const quiet = 30 * time.Second
	snapshot := func() map[string]string {
		out := map[string]string{}
		for _, name := range maintenances {
			out[name] = getNM(t, ctx, name).ResourceVersion
		}
		for _, c := range getNode(t, ctx, node).Status.Conditions {
			if c.Type == v1alpha1.NodeConditionMaintenanceInProgress || c.Type == v1alpha1.NodeConditionDrainInProgress || c.Type == v1alpha1.NodeConditionDrained {
				out[string(c.Type)] = c.LastHeartbeatTime.String() + " " + c.Message
			}
		}
		return out
	}
	time.Sleep(2 * time.Second) // the last Drained write and its echoes
	before := snapshot()
	time.Sleep(quiet)
	after := snapshot()
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s was written while nothing changed: %q, %s later %q", k, v, quiet, after[k])
		}
	}
}

// A controller restarted in the middle of a drain resumes where it
// stopped: no duplicate Evacuation, the plan does not go back, the stage
// is not started twice. A PodDisruptionBudget that allows no disruption
// holds the drain, says so, and loses nothing; it completes once the
// budget changes.
func TestControllerRestartMidDrain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	node := cluster.Nodes[2].Name
	priorityClass(t, ctx, "e2e-low", 100)
	priorityClass(t, ctx, "e2e-high", 1000)
	pinnedApp(t, ctx, ns, "low", node, "e2e-low", 2)
	pinnedApp(t, ctx, ns, "high", node, "e2e-high", 1)
	highPod := appPods(t, ctx, ns, "high")[0].Name
	releaseLow := pdb(t, ctx, ns, "low", 2)
	releaseHigh := pdb(t, ctx, ns, "high", 1)
	defer releaseHigh()

	nm := maintenance("restart", v1alpha1.Drain, byName(node))
	nm.Spec.DrainPlan = []v1alpha1.DrainPlanEntry{{PodType: v1alpha1.Default, PodPriority: 100}}
	create(t, ctx, admin, nm)
	eventually(t, ctx, 20*time.Second, "Evacuations of the two low-priority pods, blocked by their budget", func(ctx context.Context) (bool, string) {
		evs := evacuations(t, ctx, ns)
		blocked := 0
		for _, e := range evs {
			if e.Status.FailedEvictionCounter > 0 && strings.Contains(e.Status.Message, "The disruption budget low needs 2 healthy pods and has 2 currently") {
				blocked++
			}
		}
		return len(evs) == 2 && blocked == 2, fmt.Sprintf("%d Evacuations, %d blocked", len(evs), blocked)
	})

	stopController(t)
	releaseLow()
	evacuate(t, ctx, ns) // someone else evicts them while ebb is down
	podsGoneFrom(t, ctx, ns, "low", node)
	startController(t)

	eventually(t, ctx, 30*time.Second, "the drain resumed: the high-priority pod's Evacuation, held by its budget", func(ctx context.Context) (bool, string) {
		evs := evacuations(t, ctx, ns)
		e, high := evs[highPod]
		return high && len(evs) == 1 && e.Status.FailedEvictionCounter > 0, fmt.Sprintf("%d Evacuations, high %v", len(evs), high)
	})
	eventually(t, ctx, 10*time.Second, "the drain plan index past the low-priority step", func(ctx context.Context) (bool, string) {
		i := getNM(t, ctx, "restart").Status.DrainPlanIndex
		return i >= 1, fmt.Sprint(i)
	})
	got := getNM(t, ctx, "restart")
	if n := len(got.Status.StageStatuses); n != 1 {
		t.Errorf("%d stage statuses, want Drain once: %+v", n, got.Status.StageStatuses)
	}
	if meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.DrainedCondition) {
		t.Error("Drained while a pod is held by its budget")
	}
	if _, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, highPod, metav1.GetOptions{}); err != nil {
		t.Errorf("the budget-protected pod is gone: %v", err)
	}

	releaseHigh()
	eventually(t, ctx, 60*time.Second, "Drained once the budget is gone", func(ctx context.Context) (bool, string) {
		nm := getNM(t, ctx, "restart")
		return meta.IsStatusConditionTrue(nm.Status.Conditions, v1alpha1.DrainedCondition), fmt.Sprint(nm.Status.NodeStatuses)
	})
}

// controllerMetrics scrapes the leading controller replica's metrics.
func controllerMetrics(t *testing.T) string {
	t.Helper()
	return e2eutil.ControllerMetrics(t, context.Background(), cluster)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Maintenances of every stage beside a Drain on one node, and a second
// Drain started later, leave the node quiet once drained: its conditions
// come from every maintenance that holds it (issue 41 item 1). Before,
// the Cordon, Idle and Complete ones each computed the node as not
// drained, the Drains as drained, and each write woke all of them: the
// node was written for as long as they overlapped.
func TestOverlappingStagesLeaveTheNodeQuiet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	node := cluster.Nodes[1].Name
	names := []string{"quiet-drain", "quiet-cordon", "quiet-idle", "quiet-complete", "quiet-drain-later"}
	stages := []v1alpha1.NodeMaintenanceStage{v1alpha1.Drain, v1alpha1.Cordon, v1alpha1.Idle, v1alpha1.Complete, v1alpha1.Drain}
	for i, name := range names {
		if i == len(names)-1 {
			time.Sleep(1100 * time.Millisecond) // creation timestamps have whole seconds: a later start
		}
		create(t, ctx, admin, maintenance(name, stages[i], byName(node)))
	}
	eventually(t, ctx, 60*time.Second, "both Drains Drained and the node's Drained condition True", func(ctx context.Context) (bool, string) {
		a, b := getNM(t, ctx, names[0]), getNM(t, ctx, names[4])
		drained := ""
		for _, c := range getNode(t, ctx, node).Status.Conditions {
			if c.Type == v1alpha1.NodeConditionDrained {
				drained = string(c.Status) + " " + c.Message
			}
		}
		return meta.IsStatusConditionTrue(a.Status.Conditions, v1alpha1.DrainedCondition) && meta.IsStatusConditionTrue(b.Status.Conditions, v1alpha1.DrainedCondition) &&
				strings.HasPrefix(drained, "True"),
			fmt.Sprintf("node condition Drained %q; %v / %v", drained, a.Status.NodeStatuses, b.Status.NodeStatuses)
	})
	assertNoWriteLoop(t, ctx, node, names...)
}
