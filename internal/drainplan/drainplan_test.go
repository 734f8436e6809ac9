package drainplan

import (
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

func entry(t v1alpha1.PodType, p int32, sel map[string]string) v1alpha1.DrainPlanEntry {
	e := v1alpha1.DrainPlanEntry{PodType: t, PodPriority: p}
	if sel != nil {
		e.PodSelector = &metav1.LabelSelector{MatchLabels: sel}
	}
	return e
}

var postgres = map[string]string{"app": "postgres"}

func TestWithDefaults(t *testing.T) {
	if got := WithDefaults(nil); !cmp.Equal(got, Defaults()) || len(got) != 12 {
		t.Fatalf("empty plan: %v", got)
	}
	plan := []v1alpha1.DrainPlanEntry{
		entry(v1alpha1.Default, 1000, nil),
		entry(v1alpha1.Default, 2000, postgres),
		entry(v1alpha1.Default, math.MaxInt32, postgres),
		entry(v1alpha1.DaemonSet, 1000000000, nil),
	}
	got := WithDefaults(plan)
	if len(got) != 15 {
		t.Fatalf("%d entries, want 15 (4 given, 11 defaults missing): %v", len(got), got)
	}
	if errs := Validate(got, field.NewPath("drainPlan")); len(errs) > 0 {
		t.Fatalf("defaulted plan is invalid: %v", errs)
	}
	// The selector entry at MaxInt32 comes before the default one.
	if !cmp.Equal(got[5], entry(v1alpha1.Default, math.MaxInt32, postgres)) || !cmp.Equal(got[6], entry(v1alpha1.Default, math.MaxInt32, nil)) {
		t.Errorf("order at the end of Default: %v, %v", got[5], got[6])
	}
	if !cmp.Equal(WithDefaults(got), got) {
		t.Error("defaulting twice changed the plan")
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		plan []v1alpha1.DrainPlanEntry
		want string // substring of the error; "" for valid
	}{
		{"defaults", Defaults(), ""},
		{"selector first at the same priority", []v1alpha1.DrainPlanEntry{entry(v1alpha1.Default, 5, postgres), entry(v1alpha1.Default, 5, nil)}, ""},
		{"descending priority", []v1alpha1.DrainPlanEntry{entry(v1alpha1.Default, 5, nil), entry(v1alpha1.Default, 4, nil)}, "ascending podPriority"},
		{"type order", []v1alpha1.DrainPlanEntry{entry(v1alpha1.DaemonSet, 5, nil), entry(v1alpha1.Default, 9, nil)}, "order entries by podType"},
		{"selector after the general entry", []v1alpha1.DrainPlanEntry{entry(v1alpha1.Default, 5, nil), entry(v1alpha1.Default, 5, postgres)}, "podSelector entries before"},
		{"duplicate", []v1alpha1.DrainPlanEntry{entry(v1alpha1.Default, 5, postgres), entry(v1alpha1.Default, 5, postgres)}, "Duplicate value"},
		{"unknown type", []v1alpha1.DrainPlanEntry{entry("Job", 5, nil)}, "Unsupported value"},
		{"bad selector", []v1alpha1.DrainPlanEntry{{PodType: v1alpha1.Default, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"a b": "c"}}}}, "podSelector"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := Validate(tt.plan, field.NewPath("spec", "drainPlan"))
			if tt.want == "" {
				if len(errs) > 0 {
					t.Fatalf("unexpected errors: %v", errs)
				}
				return
			}
			if !strings.Contains(errs.ToAggregate().Error(), tt.want) {
				t.Fatalf("errors %v, want one containing %q", errs, tt.want)
			}
		})
	}
}

// The progression example of KEP-4212 ("PodTypes and Label Selectors
// Progression"), step by step.
func TestTargetsAtFollowsTheKEPProgression(t *testing.T) {
	plan := []v1alpha1.DrainPlanEntry{
		entry(v1alpha1.Default, 1000, nil),
		entry(v1alpha1.Default, 2000, postgres),
		entry(v1alpha1.Default, math.MaxInt32, nil),
		entry(v1alpha1.DaemonSet, 1000, nil),
		entry(v1alpha1.DaemonSet, math.MaxInt32, nil),
		entry(v1alpha1.Static, math.MaxInt32, nil),
	}
	const top = math.MaxInt32
	want := [][]v1alpha1.DrainPlanEntry{
		{entry(v1alpha1.Default, 1000, nil), entry(v1alpha1.Default, 1000, postgres)},
		{entry(v1alpha1.Default, 1000, nil), entry(v1alpha1.Default, 2000, postgres)},
		{entry(v1alpha1.Default, top, nil), entry(v1alpha1.Default, top, postgres)},
		{entry(v1alpha1.Default, top, nil), entry(v1alpha1.Default, top, postgres), entry(v1alpha1.DaemonSet, 1000, nil)},
		{entry(v1alpha1.Default, top, nil), entry(v1alpha1.Default, top, postgres), entry(v1alpha1.DaemonSet, top, nil)},
		{entry(v1alpha1.Default, top, nil), entry(v1alpha1.Default, top, postgres), entry(v1alpha1.DaemonSet, top, nil), entry(v1alpha1.Static, top, nil)},
	}
	for i := range plan {
		if diff := cmp.Diff(want[i], TargetsAt(plan, i)); diff != "" {
			t.Errorf("step %d (-want +got):\n%s", i+1, diff)
		}
	}
}

func TestMatches(t *testing.T) {
	ds := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "d", Controller: ptr.To(true)}}}}
	mirror := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "x"}}}
	db := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: postgres}, Spec: corev1.PodSpec{Priority: ptr.To[int32](1500)}}
	plain := &corev1.Pod{}
	targets := []v1alpha1.DrainPlanEntry{entry(v1alpha1.Default, 1000, nil), entry(v1alpha1.Default, 2000, postgres)}
	tests := []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"plain pod, priority 0", plain, true},
		{"postgres at 1500 through its selector", db, true},
		{"DaemonSet pod not targeted by Default entries", ds, false},
		{"mirror pod not targeted by Default entries", mirror, false},
		{"other pod at 1500", &corev1.Pod{Spec: corev1.PodSpec{Priority: ptr.To[int32](1500)}}, false},
	}
	for _, tt := range tests {
		if got := Matches(targets, tt.pod); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	if TypeOf(ds) != v1alpha1.DaemonSet || TypeOf(mirror) != v1alpha1.Static || TypeOf(plain) != v1alpha1.Default {
		t.Error("pod types")
	}
}

// Levels order targets by the pods they reach, a pod selector included:
// each step of a plan reaches strictly further than the one before, and a
// selector step does not tie with the plain step of its priority (a tie
// let the targets of a node go back from the plain step to the selector
// step).
func TestLevelsGrowStrictlyAlongAPlan(t *testing.T) {
	sel := map[string]string{"tier": "cache"}
	plan := []v1alpha1.DrainPlanEntry{
		entry(v1alpha1.Default, 1000, nil),
		entry(v1alpha1.Default, 2000, sel),
		entry(v1alpha1.Default, 2000, nil),
		entry(v1alpha1.DaemonSet, 1000, nil),
	}
	for i := 1; i < len(plan); i++ {
		if prev, cur := LevelAt(plan, i-1), LevelAt(plan, i); !prev.Less(cur) {
			t.Errorf("step %d (%+v) does not reach further than step %d (%+v)", i, cur, i-1, prev)
		}
	}
	for _, tt := range []struct {
		name       string
		less, more []v1alpha1.DrainPlanEntry
	}{
		{"selector step below the plain step", []v1alpha1.DrainPlanEntry{entry(v1alpha1.Default, 1000, nil), entry(v1alpha1.Default, 2000, sel)}, []v1alpha1.DrainPlanEntry{entry(v1alpha1.Default, 2000, nil)}},
		{"lower priority", []v1alpha1.DrainPlanEntry{entry(v1alpha1.Default, 1000, nil)}, []v1alpha1.DrainPlanEntry{entry(v1alpha1.Default, 2000, sel)}},
		{"earlier type", []v1alpha1.DrainPlanEntry{entry(v1alpha1.Default, 5000, nil)}, []v1alpha1.DrainPlanEntry{entry(v1alpha1.Default, 5000, nil), entry(v1alpha1.DaemonSet, 0, nil)}},
		{"none", nil, []v1alpha1.DrainPlanEntry{entry(v1alpha1.Default, 0, sel)}},
	} {
		l, m := LevelOf(tt.less), LevelOf(tt.more)
		if !l.Less(m) || m.Less(l) {
			t.Errorf("%s: %+v should be below %+v", tt.name, l, m)
		}
	}
}
