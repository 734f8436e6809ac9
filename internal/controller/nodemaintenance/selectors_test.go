package nodemaintenance

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/drainplan"
)

// labelled is a Default pod of a priority with labels, on node x.
type labelled struct {
	prio   int32
	labels map[string]string
}

func selected(app string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}
}

// Issue 41 item 6: podSelector entries across maintenances. Three
// maintenances share node x; two have a "cache pods first" step (a
// selector entry between two plain priorities). Driven to the end (every
// targeted pod evacuated at each step), the node's published targets never
// move backwards (each step's targets select every pod the previous one
// did), every maintenance ends Drained, and no pod is evacuated that
// none of the maintenances' own targets selected at that step.
func TestSelectorEntriesKeepTheOrderAcrossMaintenances(t *testing.T) {
	t0 := time.Now()
	max := int(^uint32(0) >> 1)
	withSel := func(prio int, app string) v1alpha1.DrainPlanEntry {
		return v1alpha1.DrainPlanEntry{PodType: v1alpha1.Default, PodPriority: int32(prio), PodSelector: selected(app)}
	}
	gen := func(prio int) v1alpha1.DrainPlanEntry {
		return v1alpha1.DrainPlanEntry{PodType: v1alpha1.Default, PodPriority: int32(prio)}
	}
	a := &drainState{Name: "a", Created: t0, Nodes: []string{"x"},
		Plan: []v1alpha1.DrainPlanEntry{gen(1000), withSel(2000, "postgres"), gen(max)}}
	b := &drainState{Name: "b", Created: t0.Add(time.Second), Nodes: []string{"x"},
		Plan: []v1alpha1.DrainPlanEntry{gen(1500), gen(3000), gen(max)}}
	c := &drainState{Name: "c", Created: t0.Add(2 * time.Second), Nodes: []string{"x"},
		Plan: []v1alpha1.DrainPlanEntry{withSel(1200, "redis"), gen(1200), withSel(2500, "redis"), gen(max)}}
	pods := []labelled{
		{500, nil}, {1100, map[string]string{"app": "redis"}}, {1100, nil}, {1300, nil},
		{1800, map[string]string{"app": "postgres"}}, {1800, map[string]string{"app": "redis"}}, {1800, nil},
		{2200, map[string]string{"app": "redis"}}, {2700, nil}, {4000, map[string]string{"app": "postgres"}},
	}
	pod := func(p labelled) *corev1.Pod {
		prio := p.prio
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: p.labels}, Spec: corev1.PodSpec{Priority: &prio}}
	}
	remaining := func(node string, targets []v1alpha1.DrainPlanEntry) int {
		n := 0
		for _, p := range pods {
			if drainplan.Matches(targets, pod(p)) {
				n++
			}
		}
		return n
	}
	states := []*drainState{a, b, c}
	var published []v1alpha1.DrainPlanEntry
	for step := 0; ; step++ {
		if step == 50 {
			t.Fatalf("not drained after 50 steps: a at %d, b at %d, c at %d; targets %v", a.Index, b.Index, c.Index, published)
		}
		r := resolve(states, remaining)
		targets := r.nodes["x"].Targets
		if !drainplan.Covers(targets, published) {
			t.Fatalf("step %d: the targets moved back, from %v to %v", step, published, targets)
		}
		for _, p := range pods {
			if drainplan.Matches(targets, pod(p)) && !slices.ContainsFunc(states, func(s *drainState) bool {
				return drainplan.Matches(s.own(), pod(p)) || drainplan.Matches(s.Recorded["x"], pod(p))
			}) {
				t.Errorf("step %d: pod %v targeted, but by no maintenance's own targets nor any earlier step", step, p)
			}
		}
		published = targets
		record(r)
		if r.drained(a) && r.drained(b) && r.drained(c) {
			break
		}
		var left []labelled
		for _, p := range pods {
			if !drainplan.Matches(targets, pod(p)) {
				left = append(left, p)
			}
		}
		if len(left) == len(pods) && !r.drained(a) {
			for _, s := range states {
				t.Logf("%s at %d: %s", s.Name, s.Index, r.message(s, "x"))
			}
			t.Fatalf("step %d: nothing to evacuate and nothing moves on (targets %v, pods %v)", step, targets, fmt.Sprint(pods))
		}
		pods = left
	}
}
