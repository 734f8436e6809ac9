package nodemaintenance

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// Maintenances start draining first come, first served while the nodes
// draining at once stay within the limit; started ones keep their slots
// until their nodes are Drained.
func TestDrainSlots(t *testing.T) {
	base := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	mk := func(name string, age int, started bool, nodes ...string) v1alpha1.NodeMaintenance {
		nm := v1alpha1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(base.Add(time.Duration(age) * time.Minute))},
			Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain}}
		ss := v1alpha1.StageStatus{Name: v1alpha1.Drain}
		if started {
			ss.StartTimestamp = &metav1.Time{Time: base}
		}
		nm.Status.StageStatuses = []v1alpha1.StageStatus{ss}
		return nm
	}
	cordon := mk("cordon", 0, false, "a")
	cordon.Spec.Stage = v1alpha1.Cordon
	for _, tc := range []struct {
		name    string
		limit   int
		nms     []v1alpha1.NodeMaintenance
		nodes   map[string][]string
		drained []string
		want    []string // waiting
	}{
		{"no limit", 0, []v1alpha1.NodeMaintenance{mk("m1", 0, false), mk("m2", 1, false)},
			map[string][]string{"m1": {"a", "b"}, "m2": {"c"}}, nil, nil},
		{"the first fits, the next waits", 2, []v1alpha1.NodeMaintenance{mk("m2", 1, false), mk("m1", 0, false)},
			map[string][]string{"m1": {"a", "b"}, "m2": {"c"}}, nil, []string{"m2"}},
		{"started ones hold their slots", 2, []v1alpha1.NodeMaintenance{mk("new", 0, false), mk("old", 5, true)},
			map[string][]string{"new": {"a"}, "old": {"b", "c"}}, nil, []string{"new"}},
		{"a drained node frees its slot", 2, []v1alpha1.NodeMaintenance{mk("new", 0, false), mk("old", 5, true)},
			map[string][]string{"new": {"a"}, "old": {"b", "c"}}, []string{"c"}, nil},
		{"a node shared with a started one needs no slot", 2, []v1alpha1.NodeMaintenance{mk("new", 9, false), mk("old", 0, true)},
			map[string][]string{"new": {"b", "c"}, "old": {"b", "c"}}, nil, nil},
		{"larger than the limit: starts alone", 1, []v1alpha1.NodeMaintenance{mk("big", 0, false), mk("small", 1, false)},
			map[string][]string{"big": {"a", "b", "c"}, "small": {"d"}}, nil, []string{"small"}},
		{"no overtaking: a small one waits behind a big one", 2, []v1alpha1.NodeMaintenance{mk("old", 0, true), mk("big", 1, false), mk("small", 2, false)},
			map[string][]string{"old": {"a"}, "big": {"b", "c"}, "small": {"d"}}, nil, []string{"big", "small"}},
		{"other stages take no slot", 1, []v1alpha1.NodeMaintenance{cordon, mk("m1", 1, false)},
			map[string][]string{"cordon": {"a"}, "m1": {"b"}}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &world{maintenances: tc.nms, selected: tc.nodes}
			for _, n := range []string{"a", "b", "c", "d"} {
				node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}
				if slices.Contains(tc.drained, n) {
					node.Status.Conditions = []corev1.NodeCondition{{Type: v1alpha1.NodeConditionDrained, Status: corev1.ConditionTrue}}
				}
				w.nodes = append(w.nodes, node)
			}
			waiting := drainSlots(w, tc.limit)
			got := slices.Sorted(maps.Keys(waiting))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("waiting %v, want %v", got, tc.want)
			}
			for name, msg := range waiting {
				if !strings.Contains(msg, "--max-draining-nodes") {
					t.Errorf("%s: message %q does not name the flag", name, msg)
				}
			}
		})
	}
}
