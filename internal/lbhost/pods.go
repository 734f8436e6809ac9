package lbhost

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// PodLabel selects the `ebb lb` DaemonSet's pods (config/lb). Each names
// its LoadBalancerReport after itself (`ebb lb --report-name`, default
// $POD_NAME).
var PodLabel = client.MatchingLabels{"app.kubernetes.io/name": "ebb-lb"}

// ListPods lists the `ebb lb` pods of every namespace.
func ListPods(ctx context.Context, c client.Reader) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := c.List(ctx, &list, PodLabel); err != nil {
		return nil, fmt.Errorf("listing the ebb lb pods: %w", err)
	}
	return list.Items, nil
}

// Unreported returns the `ebb lb` pods that run (on a node, Running, not
// being deleted) but have no fresh LoadBalancerReport: replicas whose
// view of the nodes is unknown, which a missing report must not turn into
// "Down, no connection" (a replica that cannot write its report, or whose
// report was deleted, still sends traffic).
func Unreported(pods []corev1.Pod, reports []v1alpha1.LoadBalancerReport, now metav1.Time) []corev1.Pod {
	fresh := map[string]bool{}
	for i := range reports {
		if reports[i].Fresh(now) {
			fresh[reports[i].Name] = true
		}
	}
	var out []corev1.Pod
	for _, p := range pods {
		if p.Spec.NodeName == "" || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil || fresh[p.Name] {
			continue
		}
		out = append(out, p)
	}
	return out
}
