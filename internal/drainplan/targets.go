package drainplan

import (
	"math"
	"slices"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// Level is how far drain targets reach: the last pod type targeted, the
// highest priority reached for it, and the priority reached for it by the
// entry without a pod selector (pods no selector picks). Levels order
// drain targets by power.
type Level struct {
	Rank     int
	Priority int32
	// General is math.MinInt32 when only selector entries are reached.
	General int32
}

// Less reports whether l targets fewer pods than m. Between two levels
// that reach the same priority, the one whose plain entry reaches less is
// less: [{Default,1000},{Default,2000,selector}] targets fewer pods than
// [{Default,2000}], and moving from the second to the first would go back.
func (l Level) Less(m Level) bool {
	if l.Rank != m.Rank {
		return l.Rank < m.Rank
	}
	if l.Priority != m.Priority {
		return l.Priority < m.Priority
	}
	return l.General < m.General
}

// LevelAt is the level of a plan's entry index: that of its targets.
func LevelAt(plan []v1alpha1.DrainPlanEntry, index int) Level {
	return LevelOf(TargetsAt(plan, index))
}

// LevelOf is the level of drain targets (the zero Level, below every
// plan entry's, for none).
func LevelOf(targets []v1alpha1.DrainPlanEntry) Level {
	l := Level{Rank: -1}
	for _, t := range targets {
		r := TypeRank(t.PodType)
		if r > l.Rank {
			l = Level{Rank: r, Priority: math.MinInt32, General: math.MinInt32}
		}
		if r == l.Rank {
			l.Priority = max(l.Priority, t.PodPriority)
			if t.PodSelector == nil {
				l.General = max(l.General, t.PodPriority)
			}
		}
	}
	return l
}

// TargetsAt returns the drain targets once a plan has reached entry index,
// as the KEP's progression example shows them: per pod type reached, one
// entry without a selector at the highest priority reached, and one per
// pod selector of that type at the higher of that priority and the
// selector's own highest entry reached. Earlier types are fully targeted.
// Targets only grow as index grows.
func TargetsAt(plan []v1alpha1.DrainPlanEntry, index int) []v1alpha1.DrainPlanEntry {
	if len(plan) == 0 {
		return nil
	}
	index = min(max(index, 0), len(plan)-1)
	current := TypeRank(plan[index].PodType)
	var out []v1alpha1.DrainPlanEntry
	for rank, typ := range podTypes {
		if rank > current {
			break
		}
		// Entries of this type reached so far: all of them for earlier
		// types, up to index for the current one.
		var reached, all []v1alpha1.DrainPlanEntry
		for i, e := range plan {
			if e.PodType != typ {
				continue
			}
			all = append(all, e)
			if rank < current || i <= index {
				reached = append(reached, e)
			}
		}
		general, hasGeneral := int32(0), false
		for _, e := range reached {
			if e.PodSelector == nil && (!hasGeneral || e.PodPriority > general) {
				general, hasGeneral = e.PodPriority, true
			}
		}
		if hasGeneral {
			out = append(out, v1alpha1.DrainPlanEntry{PodType: typ, PodPriority: general})
		}
		// One entry per selector of this type, in the plan's order.
		var selectors []*metav1.LabelSelector
		for _, e := range all {
			if e.PodSelector != nil && !slices.ContainsFunc(selectors, func(s *metav1.LabelSelector) bool { return apiequality.Semantic.DeepEqual(s, e.PodSelector) }) {
				selectors = append(selectors, e.PodSelector)
			}
		}
		for _, sel := range selectors {
			prio, ok := general, hasGeneral
			for _, e := range reached {
				if e.PodSelector != nil && apiequality.Semantic.DeepEqual(e.PodSelector, sel) && (!ok || e.PodPriority > prio) {
					prio, ok = e.PodPriority, true
				}
			}
			if ok {
				out = append(out, v1alpha1.DrainPlanEntry{PodType: typ, PodPriority: prio, PodSelector: sel.DeepCopy()})
			}
		}
	}
	return out
}
