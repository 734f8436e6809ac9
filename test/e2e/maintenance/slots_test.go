package maintenance_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// With `ebb controller --max-draining-nodes=1`, a second maintenance waits
// in Drain (its node cordoned, not tainted, its pod left alone, the wait
// in its condition) until the first one's node is drained, then drains.
func TestDrainSlotLimitsNodesDrainingAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	restartController(t, "--max-draining-nodes=1")
	t.Cleanup(func() { restartController(t) })
	admin, _ := newClient(t, "")
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	first, second := cluster.Nodes[0].Name, cluster.Nodes[1].Name
	pinnedApp(t, ctx, ns, "held", first, "", 1)
	pinnedApp(t, ctx, ns, "waits", second, "", 1)
	release := pdb(t, ctx, ns, "held", 1) // the first drain cannot finish yet
	defer release()
	waitsPod := appPods(t, ctx, ns, "waits")[0].Name

	create(t, ctx, admin, maintenance("slot-first", v1alpha1.Drain, byName(first)))
	eventually(t, ctx, 20*time.Second, "the first maintenance draining, blocked by the budget", func(ctx context.Context) (bool, string) {
		evs := evacuations(t, ctx, ns)
		return len(evs) == 1 && hasTaint(getNode(t, ctx, first), lbmodel.TaintDraining, v1alpha1.DrainingTaintValue), fmt.Sprintf("%d Evacuations", len(evs))
	})
	create(t, ctx, admin, maintenance("slot-second", v1alpha1.Drain, byName(second)))
	eventually(t, ctx, 20*time.Second, "the second maintenance waiting for a slot, its node cordoned", func(ctx context.Context) (bool, string) {
		nm := getNM(t, ctx, "slot-second")
		c := meta.FindStatusCondition(nm.Status.Conditions, v1alpha1.DrainedCondition)
		return c != nil && c.Reason == v1alpha1.ReasonWaitingForDrainSlot && getNode(t, ctx, second).Spec.Unschedulable, fmt.Sprintf("%+v", c)
	})
	// While it waits, nothing happens to its node beyond the cordon.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if n := getNode(t, ctx, second); hasTaint(n, lbmodel.TaintDraining, v1alpha1.DrainingTaintValue) {
			t.Fatalf("node %s tainted draining while its maintenance waits for a slot", second)
		}
		if _, ok := evacuations(t, ctx, ns)[waitsPod]; ok {
			t.Fatalf("pod %s asked to evacuate while its maintenance waits for a slot", waitsPod)
		}
		time.Sleep(500 * time.Millisecond)
	}
	nm := getNM(t, ctx, "slot-second")
	if st := nm.Status.StageStatuses; len(st) != 1 || st[0].Name != v1alpha1.Drain || st[0].StartTimestamp != nil {
		t.Errorf("stage statuses %+v: want Drain, not started", st)
	}
	if msg := nodeStatus(nm, second).DrainMessage; msg == "" {
		t.Error("the waiting node's status says nothing")
	} else {
		t.Logf("the waiting node's status: %s", msg)
	}
	if !slices.Contains(maintenanceEvents(t, ctx, "slot-second"), v1alpha1.ReasonWaitingForDrainSlot) {
		t.Errorf("no %s event", v1alpha1.ReasonWaitingForDrainSlot)
	}

	release()
	for _, name := range []string{"slot-first", "slot-second"} {
		eventually(t, ctx, 90*time.Second, name+" Drained", func(ctx context.Context) (bool, string) {
			nm := getNM(t, ctx, name)
			return meta.IsStatusConditionTrue(nm.Status.Conditions, v1alpha1.DrainedCondition), fmt.Sprint(nm.Status.Conditions)
		})
	}
	firstDone := getNM(t, ctx, "slot-first")
	secondDone := getNM(t, ctx, "slot-second")
	started := secondDone.Status.StageStatuses[0].StartTimestamp
	drained := meta.FindStatusCondition(firstDone.Status.Conditions, v1alpha1.DrainedCondition).LastTransitionTime
	if started == nil || started.Before(&drained) {
		t.Errorf("the second drain started at %v, before the first was drained at %v", started, drained)
	}
}
