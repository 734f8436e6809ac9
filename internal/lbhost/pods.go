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
var PodLabel = client.MatchingLabels{"app.kubernetes.io/name": DaemonSet}

// DaemonSet is the name of ebb lb's DaemonSet (config/lb).
const DaemonSet = "ebb-lb"

// DefaultNamespace is where ebb installs it (config/default).
const DefaultNamespace = "ebb-system"

// Survey reads the LoadBalancerReports and the `ebb lb` pods of namespace
// (ListPods) and checks whether taking away every node for which gone is
// true would leave no serving replica (Check).
func Survey(ctx context.Context, c client.Reader, namespace string, now metav1.Time, gone func(node string) bool) (Stranding, error) {
	var reports v1alpha1.LoadBalancerReportList
	if err := c.List(ctx, &reports); err != nil {
		return Stranding{}, fmt.Errorf("listing LoadBalancerReports: %w", err)
	}
	pods, err := ListPods(ctx, c, namespace)
	if err != nil {
		return Stranding{}, err
	}
	return Check(reports.Items, Unreported(pods, reports.Items, now), now, gone), nil
}

// ListPods lists the `ebb lb` pods in namespace (DefaultNamespace when
// empty) that the ebb-lb DaemonSet controls. Anyone who may create pods
// can give one the label: a pod ebb's DaemonSet does not own is no
// replica, or a namespace user could make the last-LB-host check see a
// host that stays.
func ListPods(ctx context.Context, c client.Reader, namespace string) ([]corev1.Pod, error) {
	if namespace == "" {
		namespace = DefaultNamespace
	}
	var list corev1.PodList
	if err := c.List(ctx, &list, PodLabel, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing the ebb lb pods: %w", err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.Kind == "DaemonSet" && ref.APIVersion == "apps/v1" && ref.Name == DaemonSet {
			out = append(out, p)
		}
	}
	return out, nil
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
