// Package drainplan holds the rules of a NodeMaintenance's drain plan
// (KEP-4212): the default entries, their order, which pods an entry
// selects, and the drain targets a plan reaches step by step. Pure
// functions, shared by admission and the controller.
package drainplan

import (
	"fmt"
	"math"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// The priorities of the default entries: the highest user-defined
// priority class, system-cluster-critical, system-node-critical, and the
// maximum.
var defaultPriorities = []int32{1000000000, 2000000000, 2000001000, math.MaxInt32}

// podTypes in the order they are drained.
var podTypes = []v1alpha1.PodType{v1alpha1.Default, v1alpha1.DaemonSet, v1alpha1.Static}

// TypeRank is a pod type's place in the drain order (Default first); -1 if
// unknown.
func TypeRank(t v1alpha1.PodType) int { return slices.Index(podTypes, t) }

// Defaults returns the twelve entries every plan contains.
func Defaults() []v1alpha1.DrainPlanEntry {
	var out []v1alpha1.DrainPlanEntry
	for _, t := range podTypes {
		for _, p := range defaultPriorities {
			out = append(out, v1alpha1.DrainPlanEntry{PodType: t, PodPriority: p})
		}
	}
	return out
}

// before reports whether entry a must come before b: by pod type, then by
// ascending priority, then entries with a pod selector before those
// without (the concrete selector goes first).
func before(a, b v1alpha1.DrainPlanEntry) bool {
	if ra, rb := TypeRank(a.PodType), TypeRank(b.PodType); ra != rb {
		return ra < rb
	}
	if a.PodPriority != b.PodPriority {
		return a.PodPriority < b.PodPriority
	}
	return a.PodSelector != nil && b.PodSelector == nil
}

func same(a, b v1alpha1.DrainPlanEntry) bool {
	return a.PodType == b.PodType && a.PodPriority == b.PodPriority && apiequality.Semantic.DeepEqual(a.PodSelector, b.PodSelector)
}

// WithDefaults returns plan with the default entries that are missing
// inserted where the order puts them; the user's entries keep their order.
func WithDefaults(plan []v1alpha1.DrainPlanEntry) []v1alpha1.DrainPlanEntry {
	out := slices.Clone(plan)
	for _, d := range Defaults() {
		if slices.ContainsFunc(out, func(e v1alpha1.DrainPlanEntry) bool { return same(e, d) }) {
			continue
		}
		// After the last entry that does not have to come after d.
		at := len(out)
		for at > 0 && before(d, out[at-1]) {
			at--
		}
		out = slices.Insert(out, at, d)
	}
	return out
}

// Validate checks a plan's entries, their order and that none repeats.
func Validate(plan []v1alpha1.DrainPlanEntry, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, e := range plan {
		p := path.Index(i)
		if TypeRank(e.PodType) < 0 {
			errs = append(errs, field.NotSupported(p.Child("podType"), e.PodType, []string{"Default", "DaemonSet", "Static"}))
		}
		if e.PodSelector != nil {
			if _, err := metav1.LabelSelectorAsSelector(e.PodSelector); err != nil {
				errs = append(errs, field.Invalid(p.Child("podSelector"), e.PodSelector, err.Error()))
			}
		}
		for j := range i {
			if same(plan[j], e) {
				errs = append(errs, field.Duplicate(p, fmt.Sprintf("the same entry as %s: remove one of them", path.Index(j))))
			}
		}
		if i > 0 && before(e, plan[i-1]) {
			errs = append(errs, field.Invalid(p, describe(e), fmt.Sprintf(
				"must not come after %s (%s): order entries by podType (Default, DaemonSet, Static), then by ascending podPriority, with podSelector entries before the entry without one at the same priority",
				path.Index(i-1), describe(plan[i-1]))))
		}
	}
	return errs
}

func describe(e v1alpha1.DrainPlanEntry) string {
	s := fmt.Sprintf("%s pods with priority <= %d", e.PodType, e.PodPriority)
	if e.PodSelector != nil {
		s += " matching " + metav1.FormatLabelSelector(e.PodSelector)
	}
	return s
}

// MirrorPodAnnotation marks a static pod's mirror in the API.
const MirrorPodAnnotation = corev1.MirrorPodAnnotationKey

// DrainingTaint is the taint a drain puts on its nodes: new pods stay away
// and the load balancers turn the node's backends Down.
func DrainingTaint() corev1.Taint {
	return corev1.Taint{Key: lbmodel.TaintDraining, Value: v1alpha1.DrainingTaintValue, Effect: corev1.TaintEffectNoSchedule}
}

// ToleratesDraining reports whether a DaemonSet pod tolerates the draining
// taint: the DaemonSet controller would recreate it on the node at once,
// so it is reported rather than fought.
func ToleratesDraining(p *corev1.Pod) bool {
	if TypeOf(p) != v1alpha1.DaemonSet {
		return false
	}
	taint := DrainingTaint()
	for _, t := range p.Spec.Tolerations {
		if t.ToleratesTaint(klog.Background(), &taint, false) {
			return true
		}
	}
	return false
}

// TypeOf returns a pod's type: Static for mirror pods, DaemonSet for pods
// a DaemonSet controls, Default for the rest.
func TypeOf(pod *corev1.Pod) v1alpha1.PodType {
	if _, ok := pod.Annotations[MirrorPodAnnotation]; ok {
		return v1alpha1.Static
	}
	if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "DaemonSet" && ref.APIVersion == "apps/v1" {
		return v1alpha1.DaemonSet
	}
	return v1alpha1.Default
}

// priorityOf is a pod's priority (0 when unset, as the scheduler treats it).
func priorityOf(pod *corev1.Pod) int32 {
	if pod.Spec.Priority != nil {
		return *pod.Spec.Priority
	}
	return 0
}

// Matches reports whether any of the targets selects the pod.
func Matches(targets []v1alpha1.DrainPlanEntry, pod *corev1.Pod) bool {
	typ, prio := TypeOf(pod), priorityOf(pod)
	for _, t := range targets {
		if t.PodType != typ || prio > t.PodPriority {
			continue
		}
		if t.PodSelector == nil {
			return true
		}
		sel, err := metav1.LabelSelectorAsSelector(t.PodSelector)
		if err == nil && sel.Matches(labels.Set(pod.Labels)) {
			return true
		}
	}
	return false
}
