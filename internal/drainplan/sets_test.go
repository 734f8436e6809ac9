package drainplan

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

func TestCoversAndUnionCompareTheSelectedPods(t *testing.T) {
	pg := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "postgres"}}
	d := func(prio int32) v1alpha1.DrainPlanEntry {
		return v1alpha1.DrainPlanEntry{PodType: v1alpha1.Default, PodPriority: prio}
	}
	sel := func(prio int32) v1alpha1.DrainPlanEntry {
		return v1alpha1.DrainPlanEntry{PodType: v1alpha1.Default, PodPriority: prio, PodSelector: pg}
	}
	ds := v1alpha1.DrainPlanEntry{PodType: v1alpha1.DaemonSet, PodPriority: 1000}
	cachesFirst := []v1alpha1.DrainPlanEntry{d(1000), sel(2000)}
	plain := []v1alpha1.DrainPlanEntry{d(1500)}
	tests := []struct {
		name   string
		a, b   []v1alpha1.DrainPlanEntry
		covers bool
	}{
		{"nothing covers nothing", nil, nil, true},
		{"anything covers nothing", plain, nil, true},
		{"higher plain priority", []v1alpha1.DrainPlanEntry{d(2000)}, plain, true},
		{"lower plain priority", plain, []v1alpha1.DrainPlanEntry{d(2000)}, false},
		{"a selector step does not cover a higher plain one", cachesFirst, plain, false},
		{"nor the other way", plain, cachesFirst, false},
		{"a plain priority covers a selector's up to it", []v1alpha1.DrainPlanEntry{d(2000)}, cachesFirst, true},
		{"another type is not covered", plain, []v1alpha1.DrainPlanEntry{d(1000), ds}, false},
	}
	for _, tt := range tests {
		if got := Covers(tt.a, tt.b); got != tt.covers {
			t.Errorf("%s: Covers = %t, want %t", tt.name, got, tt.covers)
		}
		u := Union(tt.a, tt.b)
		if !Covers(u, tt.a) || !Covers(u, tt.b) {
			t.Errorf("%s: Union %v does not cover both", tt.name, u)
		}
	}
	if got, want := Union(cachesFirst, plain), []v1alpha1.DrainPlanEntry{d(1500), sel(2000)}; !reflect.DeepEqual(got, want) {
		t.Errorf("Union = %v, want %v", got, want)
	}
}
