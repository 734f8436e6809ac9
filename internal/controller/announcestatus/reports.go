package announcestatus

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlreconcile "sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=loadbalancerreports,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// recheck is how often a status is rebuilt without an event: a replica
// that stops reporting goes stale without one.
const recheck = 30 * time.Second

// freshReports returns the LoadBalancerReports still renewed whose host
// Node exists, and those Nodes' labels by name.
func freshReports(ctx context.Context, c client.Client, now time.Time) ([]v1alpha1.LoadBalancerReport, map[string]labels.Set, error) {
	var reports v1alpha1.LoadBalancerReportList
	if err := c.List(ctx, &reports); err != nil {
		return nil, nil, fmt.Errorf("listing LoadBalancerReports: %w", err)
	}
	nodes := map[string]labels.Set{}
	t := metav1.NewTime(now)
	var fresh []v1alpha1.LoadBalancerReport
	for _, rep := range reports.Items {
		host := rep.Status.HostNode
		if host == "" || !rep.Fresh(t) {
			continue
		}
		if _, ok := nodes[host]; !ok {
			var n corev1.Node
			if err := c.Get(ctx, client.ObjectKey{Name: host}, &n); err != nil {
				continue // gone: its host serves nothing
			}
			nodes[host] = n.Labels
		}
		fresh = append(fresh, rep)
	}
	return fresh, nodes, nil
}

// requests are reconcile requests for every object of a cluster-scoped
// list.
func requests[T any, PT interface {
	*T
	client.Object
}](items []T) []ctrlreconcile.Request {
	out := make([]ctrlreconcile.Request, 0, len(items))
	for i := range items {
		out = append(out, ctrlreconcile.Request{NamespacedName: types.NamespacedName{Name: PT(&items[i]).GetName()}})
	}
	return out
}

// withoutTimes is a copy of conditions without their transition times: a
// status rebuilt with the same conditions is no change.
func withoutTimes(conditions []metav1.Condition) []metav1.Condition {
	out := slices.Clone(conditions)
	for i := range out {
		out[i].LastTransitionTime = metav1.Time{}
	}
	return out
}
