package kubectlmaintenance

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

func TestNodeSelector(t *testing.T) {
	tests := []struct {
		name     string
		nodes    []string
		selector string
		want     string // the terms, formatted; "" when an error is wanted
	}{
		{"names", []string{"a", "b"}, "", "[metadata.name In [a]] [metadata.name In [b]]"},
		{"labels", nil, "pool=blue,zone!=z1,gpu", "[gpu Exists [] pool In [blue] zone NotIn [z1]]"},
		{"set", nil, "pool in (a,b)", "[pool In [a b]]"},
		{"bad", nil, "pool in (a", ""},
		{"everything", nil, "", ""},
	}
	for _, tt := range tests {
		sel, err := nodeSelector(tt.nodes, tt.selector)
		if tt.want == "" {
			if err == nil {
				t.Errorf("%s: no error", tt.name)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		var terms []string
		for _, term := range sel.NodeSelectorTerms {
			var reqs []string
			for _, r := range append(term.MatchFields, term.MatchExpressions...) {
				reqs = append(reqs, r.Key+" "+string(r.Operator)+" ["+strings.Join(r.Values, " ")+"]")
			}
			terms = append(terms, "["+strings.Join(reqs, " ")+"]")
		}
		if got := strings.Join(terms, " "); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestBlockersAndBar(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	ts := metav1.NewTime(now.Add(-90 * time.Second))
	evs := []v1alpha1.Evacuation{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Labels: map[string]string{v1alpha1.EvacuationNodeLabel: "n1"}},
			Spec:   v1alpha1.EvacuationSpec{PodRef: v1alpha1.PodReference{Name: "db-0"}},
			Status: v1alpha1.EvacuationStatus{FailedEvictionCounter: 3, Message: "Eviction blocked: The disruption budget db needs 1 healthy pods and has 1 currently"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Labels: map[string]string{v1alpha1.EvacuationNodeLabel: "n1"}},
			Spec:   v1alpha1.EvacuationSpec{PodRef: v1alpha1.PodReference{Name: "web-1"}},
			Status: v1alpha1.EvacuationStatus{ActiveEvacuatorClass: "surge.maintenance.ebb.dev", EvacuationProgressTimestamp: &ts, Message: "Surged"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Labels: map[string]string{v1alpha1.EvacuationNodeLabel: "n2"}},
			Spec: v1alpha1.EvacuationSpec{PodRef: v1alpha1.PodReference{Name: "other"}}, Status: v1alpha1.EvacuationStatus{FailedEvictionCounter: 1}},
	}
	got := strings.Join(blockers(evs, "n1", now), "\n")
	want := "shop/db-0: The disruption budget db needs 1 healthy pods and has 1 currently (3 evictions refused)\n" +
		"shop/web-1: evacuator surge.maintenance.ebb.dev, last progress 90s ago: Surged"
	if got != want {
		t.Errorf("blockers:\n%s\nwant:\n%s", got, want)
	}
	if b := bar(1, 4, 8); b != "[##------]" {
		t.Errorf("bar %s", b)
	}
	if s := targets([]v1alpha1.DrainPlanEntry{{PodType: v1alpha1.Default, PodPriority: 5, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}}); s != "Default<=5(app=db)" {
		t.Errorf("targets %s", s)
	}
}

// Pods the drain plan keeps for a later step are named, and nothing else:
// not those already targeted, evacuating, terminating, static, or
// DaemonSet pods that tolerate the draining taint (they never leave).
func TestHeldBackNamesPodsLaterInThePlan(t *testing.T) {
	pod := func(name string, prio int32, mutate ...func(*corev1.Pod)) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name}, Spec: corev1.PodSpec{Priority: ptr.To(prio)}}
		for _, m := range mutate {
			m(&p)
		}
		return p
	}
	now := metav1.Now()
	pods := []corev1.Pod{
		pod("web-1", 0),
		pod("web-2", 0),
		pod("db-0", 1000),
		pod("cache-0", 2000, func(p *corev1.Pod) { p.DeletionTimestamp = &now }),
		pod("kube-proxy", 2000, func(p *corev1.Pod) { p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "x"} }),
		pod("batch-1", 5000, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
		pod("agent-x", 0, func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", UID: "d", Controller: ptr.To(true)}}
			p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		}),
	}
	targets := []v1alpha1.DrainPlanEntry{{PodType: v1alpha1.Default, PodPriority: 100}}
	got := heldBack(pods, map[string]bool{"shop/web-2": true}, targets)
	want := []string{"shop/db-0: held back by the drain plan (Default pod, priority 1000): it leaves at a later step"}
	if !slices.Equal(got, want) {
		t.Errorf("held back:\n%q\nwant\n%q", got, want)
	}
}
