package nodemaintenance

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/drainplan"
)

// Two maintenances on one node, of every pair of stages beside a Drain,
// reconciled in turn as the Node updates they cause wake them: the Node's
// conditions come from every maintenance that holds the node, so after
// the first rounds nothing is written again (issue 41 item 1). Before,
// each maintenance computed Drained and DrainInProgress from itself alone
// (a Cordon, Idle or Complete one as not drained), and the two flipped
// them on every reconcile, forever.
func TestOverlappingMaintenancesLeaveTheNodeQuiet(t *testing.T) {
	created := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	maintenance := func(name string, stage v1alpha1.NodeMaintenanceStage, minute int) *v1alpha1.NodeMaintenance {
		return &v1alpha1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Name: name, Finalizers: []string{v1alpha1.MaintenanceCompletionFinalizer}, CreationTimestamp: metav1.NewTime(created.Add(time.Duration(minute) * time.Minute))},
			Spec: v1alpha1.NodeMaintenanceSpec{Stage: stage, Reason: "test", DrainPlan: drainplan.Defaults(), NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}},
			}}}},
		}
	}
	for _, other := range []v1alpha1.NodeMaintenanceStage{v1alpha1.Idle, v1alpha1.Cordon, v1alpha1.Drain, v1alpha1.Complete} {
		t.Run("Drain+"+string(other), func(t *testing.T) {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
			a, b := maintenance("a", v1alpha1.Drain, 0), maintenance("b", other, 5)
			r, cl, _ := newFakeReconciler(t, node, a, b)
			ctx := context.Background()
			var versions []string
			for round := range 6 {
				for _, nm := range []*v1alpha1.NodeMaintenance{a, b} {
					if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(nm)}); err != nil {
						t.Fatalf("round %d, %s: %v", round, nm.Name, err)
					}
				}
				n := &corev1.Node{}
				if err := cl.Get(ctx, client.ObjectKey{Name: "n1"}, n); err != nil {
					t.Fatal(err)
				}
				versions = append(versions, fmt.Sprintf("%s (DrainInProgress %s, Drained %s)", n.ResourceVersion,
					nodeConditionStatus(n, v1alpha1.NodeConditionDrainInProgress), nodeConditionStatus(n, v1alpha1.NodeConditionDrained)))
			}
			// Two rounds to settle: the finalizer and the first drain pass.
			for i := 3; i < len(versions); i++ {
				if versions[i] != versions[2] {
					t.Fatalf("the node is still written after round %d: %v", i, versions)
				}
			}
			n := &corev1.Node{}
			if err := cl.Get(ctx, client.ObjectKey{Name: "n1"}, n); err != nil {
				t.Fatal(err)
			}
			if s := nodeConditionStatus(n, v1alpha1.NodeConditionDrained); s != corev1.ConditionTrue {
				t.Errorf("an empty node under a Drain: Drained is %q, want True (%v)", s, versions)
			}
		})
	}
}
