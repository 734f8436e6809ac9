package nodemaintenance

import (
	"cmp"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// Drain slots: `ebb controller --max-draining-nodes=N` limits how many
// nodes drain at once across maintenances (KEP-4212's story of upgrading
// many nodes: capacity must not drop by more than N nodes). The unit that
// waits is a whole maintenance, not a node: a maintenance's drain plan
// moves forward only when every one of its nodes finished a level, so a
// maintenance drained node by node would hold its first nodes' slots
// while waiting for nodes that cannot start, and never finish.
//
// A maintenance in Drain has started draining once its Drain stage status
// has a start time; until then it waits: its nodes are cordoned (the
// Cordon stage's work) but not tainted draining, so their load-balancer
// backends stay Up, and no Evacuation is created. A node is draining
// while a started maintenance selects it and the node is not Drained
// (condition on the node). Waiting maintenances start first come, first
// served (creation time, then name), none overtaking another, so a large
// one is not starved by small ones; one that needs more nodes than the
// limit starts alone when nothing else drains.

// startedDraining reports whether nm is in Drain and its drain started.
func startedDraining(nm *v1alpha1.NodeMaintenance) bool {
	return nm.Spec.Stage == v1alpha1.Drain && drainStarted(nm) != nil
}

// waitingForSlot reports whether nm's status says it waits for a slot.
func waitingForSlot(nm *v1alpha1.NodeMaintenance) bool {
	n := len(nm.Status.StageStatuses)
	return nm.Spec.Stage == v1alpha1.Drain && n > 0 && nm.Status.StageStatuses[n-1].Name == v1alpha1.Drain &&
		nm.Status.StageStatuses[n-1].StartTimestamp == nil
}

// drainSlots returns, for each maintenance in Drain that must wait, why.
func drainSlots(w *world, limit int) map[string]string {
	waiting := map[string]string{}
	if limit <= 0 {
		return waiting
	}
	busy := map[string]bool{}
	var queue []*v1alpha1.NodeMaintenance
	for i := range w.maintenances {
		nm := &w.maintenances[i]
		switch {
		case nm.Spec.Stage != v1alpha1.Drain:
		case startedDraining(nm):
			for _, n := range w.selected[nm.Name] {
				if node := w.node(n); node != nil && !isDrained(node) {
					busy[n] = true
				}
			}
		default:
			queue = append(queue, nm)
		}
	}
	slices.SortFunc(queue, func(a, b *v1alpha1.NodeMaintenance) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
	blocked := false
	for i, nm := range queue {
		var more []string
		for _, n := range w.selected[nm.Name] {
			if !busy[n] {
				more = append(more, n)
			}
		}
		if !blocked && (len(busy) == 0 || len(busy)+len(more) <= limit) {
			for _, n := range more {
				busy[n] = true
			}
			continue
		}
		blocked = true
		line := "next in line"
		if i > 0 {
			line = fmt.Sprintf("%d maintenance(s) ahead", i)
		}
		waiting[nm.Name] = fmt.Sprintf("Waiting for a drain slot: %d node(s) draining, %d more needed, at most %d at once (ebb controller --max-draining-nodes); %s",
			len(busy), len(more), limit, line)
	}
	return waiting
}

// isDrained reports whether the node's Drained condition is True.
func isDrained(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if string(c.Type) == v1alpha1.NodeConditionDrained {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
