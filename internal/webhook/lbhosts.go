package webhook

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbhost"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=loadbalancerreports,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// keepsALoadBalancerHost refuses to drain every node that hosts a serving
// `ebb lb` replica: the load-balancer addresses would then have no host
// to be announced from and accepted on, and every Service of ebb's class
// would stop answering. Serving replicas are the fresh LoadBalancerReports
// that name their host and are not draining, and the ebb lb pods that run
// without a fresh report (unknown counts as serving: the check fails
// closed); a host counts as gone when
// this maintenance selects it or it is leaving already (a leaving signal:
// another maintenance, out-of-service, ...). Without any serving replica
// (none reports a host, say) there is nothing to protect. The
// AllowNoLoadBalancerAnnotation overrides it.
func (w *NodeMaintenance) keepsALoadBalancerHost(ctx context.Context, nm *v1alpha1.NodeMaintenance, selected []string, nodes []*corev1.Node) error {
	if nm.Spec.Stage != v1alpha1.Drain || nm.DeletionTimestamp != nil || nm.Annotations[v1alpha1.AllowNoLoadBalancerAnnotation] == "true" {
		return nil
	}
	now := metav1.NewTime(time.Now())
	if w.Now != nil {
		now = metav1.NewTime(w.Now())
	}
	gone := map[string]bool{}
	for _, n := range selected {
		gone[n] = true
	}
	for _, n := range nodes {
		if leaving, _ := lbmodel.IsLeaving(n, w.Model); leaving {
			gone[n.Name] = true
		}
	}
	s, err := lbhost.Survey(ctx, w.Client, w.LBNamespace, now, func(node string) bool { return gone[node] })
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	if !s.Strands() {
		return nil
	}
	return apierrors.NewForbidden(v1alpha1.GroupVersion.WithResource("nodemaintenances").GroupResource(), nm.Name, fmt.Errorf(
		"draining %s would leave no ebb lb serving the load-balancer addresses: every serving replica (%s) runs on a node this maintenance drains or that is leaving already. "+
			"Make another node a load-balancer host (label it %s=true) and wait for its ebb lb to be ready, or finish the other maintenance first, or set the annotation %s=true to drain anyway",
		strings.Join(s.Hosts, ", "), strings.Join(s.Stranded, ", "), "ebb.dev/load-balancer", v1alpha1.AllowNoLoadBalancerAnnotation))
}
