package drainplan

import (
	"math"
	"slices"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// Drain targets select pods: of each pod type they name, those up to the
// priority of the entry without a selector, and those a selector matches
// up to that selector's priority. Covers and Union compare and join
// targets as the sets of pods they select, which Level cannot: two
// targets with selectors may each select pods the other does not (a
// "cache pods first" step against a plain higher priority), and ordering
// them by one number let published targets move backwards.

// noGeneral is the general priority of a type reached only by selectors.
const noGeneral = math.MinInt64

// typeSet is what targets select of one pod type.
type typeSet struct {
	general int64
	sels    []selPriority // in the order first seen
}

type selPriority struct {
	sel      *metav1.LabelSelector
	priority int64
}

// reach is the highest priority of pods that sel matches that the set
// selects (the general entry's, or the selector's own when higher).
func (t *typeSet) reach(sel *metav1.LabelSelector) int64 {
	p := t.general
	for _, s := range t.sels {
		if apiequality.Semantic.DeepEqual(s.sel, sel) {
			p = max(p, s.priority)
		}
	}
	return p
}

func setsOf(targets []v1alpha1.DrainPlanEntry) map[v1alpha1.PodType]*typeSet {
	out := map[v1alpha1.PodType]*typeSet{}
	for _, e := range targets {
		t := out[e.PodType]
		if t == nil {
			t = &typeSet{general: noGeneral}
			out[e.PodType] = t
		}
		if e.PodSelector == nil {
			t.general = max(t.general, int64(e.PodPriority))
			continue
		}
		i := slices.IndexFunc(t.sels, func(s selPriority) bool { return apiequality.Semantic.DeepEqual(s.sel, e.PodSelector) })
		if i < 0 {
			t.sels = append(t.sels, selPriority{sel: e.PodSelector, priority: int64(e.PodPriority)})
		} else {
			t.sels[i].priority = max(t.sels[i].priority, int64(e.PodPriority))
		}
	}
	return out
}

// Covers reports whether targets a select every pod that targets b select
// (as far as the entries tell: a selector's pods are compared selector by
// selector, and with the plain entry).
func Covers(a, b []v1alpha1.DrainPlanEntry) bool {
	sa := setsOf(a)
	for typ, tb := range setsOf(b) {
		ta, ok := sa[typ]
		if !ok || ta.general < tb.general {
			return false
		}
		for _, s := range tb.sels {
			if ta.reach(s.sel) < tb.reach(s.sel) {
				return false
			}
		}
	}
	return true
}

// Union returns targets that select every pod a or b selects, in the
// form TargetsAt gives: per pod type in the plan's type order, the plain
// entry first, then one entry per selector.
func Union(a, b []v1alpha1.DrainPlanEntry) []v1alpha1.DrainPlanEntry {
	sa, sb := setsOf(a), setsOf(b)
	var out []v1alpha1.DrainPlanEntry
	for _, typ := range podTypes {
		ta, tb := sa[typ], sb[typ]
		if ta == nil && tb == nil {
			continue
		}
		if ta == nil {
			ta = &typeSet{general: noGeneral}
		}
		if tb == nil {
			tb = &typeSet{general: noGeneral}
		}
		general := max(ta.general, tb.general)
		if general != noGeneral {
			out = append(out, v1alpha1.DrainPlanEntry{PodType: typ, PodPriority: int32(general)})
		}
		var seen []*metav1.LabelSelector
		for _, s := range slices.Concat(ta.sels, tb.sels) {
			if slices.ContainsFunc(seen, func(x *metav1.LabelSelector) bool { return apiequality.Semantic.DeepEqual(x, s.sel) }) {
				continue
			}
			seen = append(seen, s.sel)
			out = append(out, v1alpha1.DrainPlanEntry{PodType: typ, PodPriority: int32(max(ta.reach(s.sel), tb.reach(s.sel))), PodSelector: s.sel.DeepCopy()})
		}
	}
	return out
}
