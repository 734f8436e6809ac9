package maintenance_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// Every stage transition the KEP allows is accepted and every other one
// is refused by the apiserver with a message that says the allowed order.
func TestStageTransitions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	stages := []v1alpha1.NodeMaintenanceStage{v1alpha1.Idle, v1alpha1.Cordon, v1alpha1.Drain, v1alpha1.Complete}
	allowed := map[[2]v1alpha1.NodeMaintenanceStage]bool{
		{v1alpha1.Idle, v1alpha1.Cordon}: true, {v1alpha1.Idle, v1alpha1.Drain}: true, {v1alpha1.Idle, v1alpha1.Complete}: true,
		{v1alpha1.Cordon, v1alpha1.Drain}: true, {v1alpha1.Cordon, v1alpha1.Complete}: true,
		{v1alpha1.Drain, v1alpha1.Complete}: true,
	}
	for _, from := range stages {
		for _, to := range stages {
			if from == to {
				continue
			}
			name := strings.ToLower(fmt.Sprintf("transition-%s-%s", from, to))
			t.Run(string(from)+"->"+string(to), func(t *testing.T) {
				create(t, ctx, admin, maintenance(name, from, byName("no-such-node")))
				err := setStage(ctx, admin, name, to)
				switch {
				case allowed[[2]v1alpha1.NodeMaintenanceStage{from, to}] && err != nil:
					t.Fatalf("refused: %v", err)
				case !allowed[[2]v1alpha1.NodeMaintenanceStage{from, to}] && err == nil:
					t.Fatal("accepted")
				case err != nil && (!apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "Idle -> Cordon | Drain | Complete")):
					t.Fatalf("refused without saying the allowed order: %v", err)
				}
			})
		}
	}
}

// Admission fills in the default drain plan, keeps the plan immutable, and
// explains what is wrong with an invalid maintenance.
func TestDefaultingAndValidation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	nm := maintenance("defaults", v1alpha1.Idle, byName("no-such-node"))
	nm.Spec.Stage = ""
	web := v1alpha1.DrainPlanEntry{PodType: v1alpha1.Default, PodPriority: 100, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}
	nm.Spec.DrainPlan = []v1alpha1.DrainPlanEntry{web}
	create(t, ctx, admin, nm)
	got := getNM(t, ctx, "defaults")
	if got.Spec.Stage != v1alpha1.Idle {
		t.Errorf("stage %q, want the default Idle", got.Spec.Stage)
	}
	if len(got.Spec.DrainPlan) != 13 || got.Spec.DrainPlan[0].PodPriority != 100 || got.Spec.DrainPlan[12].PodType != v1alpha1.Static {
		t.Errorf("drain plan after defaulting: %+v, want the given entry then the 12 defaults", got.Spec.DrainPlan)
	}

	// The controller writes the object too (finalizer, status): retry a
	// conflict with a fresh copy, so the refusal seen is admission's.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got := getNM(t, ctx, "defaults")
		got.Spec.DrainPlan = got.Spec.DrainPlan[1:]
		return admin.Update(ctx, got)
	})
	if err == nil || !strings.Contains(err.Error(), "spec.drainPlan is immutable") {
		t.Errorf("changing the drain plan: %v, want it refused as immutable", err)
	}

	tests := []struct {
		name   string
		mutate func(*v1alpha1.NodeMaintenance)
		want   string
	}{
		{"no node selector", func(nm *v1alpha1.NodeMaintenance) { nm.Spec.NodeSelector = nil }, "spec.nodeSelector: Required value"},
		{"unknown stage", func(nm *v1alpha1.NodeMaintenance) { nm.Spec.Stage = "Later" }, `Unsupported value: "Later"`},
		{"plan out of order", func(nm *v1alpha1.NodeMaintenance) {
			nm.Spec.DrainPlan = []v1alpha1.DrainPlanEntry{{PodType: v1alpha1.DaemonSet, PodPriority: 5}, {PodType: v1alpha1.Default, PodPriority: 5}}
		}, "order entries by podType (Default, DaemonSet, Static)"},
		{"duplicate entries", func(nm *v1alpha1.NodeMaintenance) { nm.Spec.DrainPlan = []v1alpha1.DrainPlanEntry{web, web} }, "Duplicate value"},
		{"empty selector terms", func(nm *v1alpha1.NodeMaintenance) {
			nm.Spec.NodeSelector = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{}}
		}, "give at least one term"},
		{"only an empty term (Kubernetes matches nothing with it)", func(nm *v1alpha1.NodeMaintenance) {
			nm.Spec.NodeSelector = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{}}}
		}, "selects no node"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nm := maintenance("invalid", v1alpha1.Idle, byName("no-such-node"))
			tt.mutate(nm)
			err := admin.Create(ctx, nm)
			if err == nil {
				deleteAndWait(t, ctx, nm.Name)
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

// A maintenance of every node is allowed, with a warning.
func TestAllNodesWarning(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, warned := newClient(t, "")
	create(t, ctx, admin, maintenance("one-node", v1alpha1.Idle, byName(cluster.Nodes[0].Name)))
	if w := warned.all(); len(w) != 0 {
		t.Errorf("warnings for one node: %v", w)
	}
	all := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: corev1.LabelOSStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"linux"}},
	}}}}
	create(t, ctx, admin, maintenance("every-node", v1alpha1.Idle, all))
	w := warned.all()
	if len(w) != 1 || !strings.Contains(w[0], fmt.Sprintf("selects all %d nodes", len(cluster.Nodes))) {
		t.Errorf("warnings %v, want one saying every node is selected", w)
	}
}

// Only someone who may delete every selected node may create, widen or
// delete a maintenance (SubjectAccessReview).
func TestMaintenanceNeedsNodeDeletePermission(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	one, two := cluster.Nodes[0].Name, cluster.Nodes[1].Name
	grant(t, ctx, admin, "alice", nil)
	grant(t, ctx, admin, "bob", []string{two})
	alice, _ := newClient(t, "alice")
	bob, _ := newClient(t, "bob")

	create(t, ctx, admin, maintenance("by-admin", v1alpha1.Idle, byName(one)))
	err := alice.Delete(ctx, &v1alpha1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Name: "by-admin"}})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `user "alice" may not delete node(s) `+one) {
		t.Errorf("alice deleting: %v, want forbidden naming %s", err, one)
	}
	err = alice.Create(ctx, maintenance("by-alice", v1alpha1.Idle, byName(one)))
	if !apierrors.IsForbidden(err) {
		t.Errorf("alice creating: %v, want forbidden", err)
	}
	// Moving the admin's planned maintenance forward needs what creating it
	// needed: alice may update NodeMaintenances, not take node one down.
	for _, stage := range []v1alpha1.NodeMaintenanceStage{v1alpha1.Drain, v1alpha1.Complete} {
		err = setStage(ctx, alice, "by-admin", stage)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), fmt.Sprintf(`user "alice" may not delete node(s) %s, and only someone who may delete every node a NodeMaintenance selects may move it to stage %s`, one, stage)) {
			t.Errorf("alice moving the admin's maintenance to %s: %v, want forbidden", stage, err)
		}
	}
	if got := getNM(t, ctx, "by-admin"); got.Spec.Stage != v1alpha1.Idle {
		t.Errorf("the admin's maintenance is %s, want still Idle", got.Spec.Stage)
	}

	nm := maintenance("by-bob", v1alpha1.Idle, byName(two))
	if err := bob.Create(ctx, nm); err != nil {
		t.Fatalf("bob may delete %s, so he may maintain it: %v", two, err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := bob.Get(ctx, client.ObjectKeyFromObject(nm), nm); err != nil {
			return err
		}
		nm.Spec.NodeSelector = byName(one, two)
		return bob.Update(ctx, nm)
	})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may not delete node(s) "+one) {
		t.Errorf("bob widening to %s: %v, want forbidden", one, err)
	}
	// Narrowing the admin's maintenance of both nodes to bob's own would
	// put node one back into service (uncordoned, its draining taint
	// removed): it needs what adding node one needed.
	create(t, ctx, admin, maintenance("both-by-admin", v1alpha1.Cordon, byName(one, two)))
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		nm := &v1alpha1.NodeMaintenance{}
		if err := bob.Get(ctx, client.ObjectKey{Name: "both-by-admin"}, nm); err != nil {
			return err
		}
		nm.Spec.NodeSelector = byName(two)
		return bob.Update(ctx, nm)
	})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may not delete node(s) "+one) || !strings.Contains(err.Error(), "narrow it") {
		t.Errorf("bob narrowing the admin's maintenance to %s: %v, want forbidden naming %s", two, err, one)
	}
	if err := bob.Delete(ctx, &v1alpha1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Name: "by-bob"}}); err != nil {
		t.Errorf("bob deleting his maintenance: %v", err)
	}
}

// grant lets user manage NodeMaintenances and read nodes, and delete the
// nodes named (none: no node).
func grant(t *testing.T, ctx context.Context, c client.Client, user string, deletable []string) {
	t.Helper()
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"nodemaintenances"}, Verbs: []string{"*"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
	}
	if len(deletable) > 0 {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"delete"}, ResourceNames: deletable})
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-" + user}, Rules: rules}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-" + user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), o) })
	}
}
