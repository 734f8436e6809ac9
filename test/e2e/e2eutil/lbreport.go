package e2eutil

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// ReportOn returns the report of the serving-or-draining ebb lb replica
// that runs on node (the freshest, if several).
func ReportOn(ctx context.Context, c client.Client, node string) (v1alpha1.LoadBalancerReport, error) {
	var list v1alpha1.LoadBalancerReportList
	if err := c.List(ctx, &list); err != nil {
		return v1alpha1.LoadBalancerReport{}, err
	}
	var best v1alpha1.LoadBalancerReport
	for _, r := range list.Items {
		if r.Status.HostNode != node || r.Status.RenewTime == nil {
			continue
		}
		if best.Status.RenewTime == nil || r.Status.RenewTime.After(best.Status.RenewTime.Time) {
			best = r
		}
	}
	if best.Status.RenewTime == nil {
		return best, fmt.Errorf("no LoadBalancerReport names %s as its host", node)
	}
	return best, nil
}

// NodeStatusOf returns the maintenance's status of node.
func NodeStatusOf(nm *v1alpha1.NodeMaintenance, node string) v1alpha1.NodeMaintenanceNodeStatus {
	for _, s := range nm.Status.NodeStatuses {
		if s.NodeRef.Name == node {
			return s
		}
	}
	return v1alpha1.NodeMaintenanceNodeStatus{}
}

// NodeByName selects one node by its name.
func NodeByName(node string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
		{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}
}
