package ebbrun

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/ebbdev/ebb/internal/localcluster"
)

// LBDaemonSet is the ebb lb DaemonSet of dist/install.yaml, in Namespace.
const (
	LBDaemonSet = "ebb-lb"
	Namespace   = ebbNamespace
)

// RolloutRestartLB replaces every ebb lb pod by the DaemonSet's update
// strategy, as `kubectl rollout restart daemonset/ebb-lb` does (a new
// template annotation): an upgrade in all but the image.
func RolloutRestartLB(ctx context.Context, c *localcluster.Cluster) error {
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
	if _, err := c.Client.AppsV1().DaemonSets(Namespace).Patch(ctx, LBDaemonSet, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("restarting the ebb lb DaemonSet: %w", err)
	}
	return nil
}

// WaitLBUpdated waits until the DaemonSet has seen its latest template
// and every one of its pods runs it and is available (old pods may still
// be terminating: they serve their established connections).
func WaitLBUpdated(ctx context.Context, c *localcluster.Cluster) error {
	var last string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		ds, err := c.Client.AppsV1().DaemonSets(Namespace).Get(ctx, LBDaemonSet, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		s := ds.Status
		last = fmt.Sprintf("generation %d observed %d, %d desired, %d updated, %d available", ds.Generation, s.ObservedGeneration, s.DesiredNumberScheduled, s.UpdatedNumberScheduled, s.NumberAvailable)
		return s.ObservedGeneration >= ds.Generation && s.UpdatedNumberScheduled == s.DesiredNumberScheduled && s.NumberAvailable == s.DesiredNumberScheduled, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the ebb lb DaemonSet to roll out (%s): %w", last, err)
	}
	return nil
}

// LBPods lists the ebb lb pods, terminating ones included.
func LBPods(ctx context.Context, c *localcluster.Cluster) ([]corev1.Pod, error) {
	pods, err := c.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + LBDaemonSet})
	if err != nil {
		return nil, fmt.Errorf("listing the ebb lb pods: %w", err)
	}
	return pods.Items, nil
}
