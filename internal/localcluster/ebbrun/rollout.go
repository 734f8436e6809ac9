package ebbrun

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/ebbdev/ebb/internal/localcluster"
)

// Names of dist/install.yaml's objects: the namespace ebb runs in, the
// ebb lb DaemonSet, and the webhook configuration whose CA tells that the
// controller serves admission.
const (
	Namespace               = "ebb-system"
	LBDaemonSet             = "ebb-lb"
	validatingConfiguration = "ebb-validating-webhook-configuration"
)

// RolloutRestartLB replaces every ebb lb pod by the DaemonSet's update
// strategy, as `kubectl rollout restart daemonset/ebb-lb` does (a new
// template annotation): an upgrade in all but the image.
func RolloutRestartLB(ctx context.Context, c *localcluster.Cluster) error {
	if _, err := c.Client.AppsV1().DaemonSets(Namespace).Patch(ctx, LBDaemonSet, types.StrategicMergePatchType, restartPatch(), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("restarting the ebb lb DaemonSet: %w", err)
	}
	return nil
}

// restartPatch is what `kubectl rollout restart` writes: a new template
// annotation, which replaces every pod by the workload's update strategy.
func restartPatch() []byte {
	return []byte(fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339Nano)))
}

// WaitLBReplaced waits until every node that ran one of the old ebb lb
// pods runs a new one that is Ready. The old pods may still be
// terminating, serving their established connections: the DaemonSet's own
// status counts a node as updated only once its old pod is gone.
func WaitLBReplaced(ctx context.Context, c *localcluster.Cluster, old []corev1.Pod) error {
	var last string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pods, err := LBPods(ctx, c)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		oldUIDs := map[types.UID]bool{}
		for _, p := range old {
			oldUIDs[p.UID] = true
		}
		replaced := map[string]bool{}
		for _, p := range pods {
			if !oldUIDs[p.UID] && p.DeletionTimestamp == nil && podReady(&p) {
				replaced[p.Spec.NodeName] = true
			}
		}
		var waiting []string
		for _, p := range old {
			if !replaced[p.Spec.NodeName] {
				waiting = append(waiting, p.Spec.NodeName)
			}
		}
		last = fmt.Sprintf("nodes without a new ready ebb lb: %v", waiting)
		return len(waiting) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the new ebb lb pods (%s): %w", last, err)
	}
	return nil
}

// WaitLBRestarted waits until the ebb lb pod, whose processes were killed,
// runs again (kubelet restarted a container of it) and is Ready.
func WaitLBRestarted(ctx context.Context, c *localcluster.Cluster, pod *corev1.Pod) error {
	restarts := func(p *corev1.Pod) int32 {
		var n int32
		for _, s := range p.Status.ContainerStatuses {
			n += s.RestartCount
		}
		return n
	}
	before := restarts(pod)
	var last string
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("restarts %d (before %d), ready %v", restarts(p), before, podReady(p))
		return restarts(p) > before && podReady(p), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for ebb lb pod %s to restart (%s): %w", pod.Name, last, err)
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// LBPodSelector selects the ebb lb DaemonSet's pods.
const LBPodSelector = "app.kubernetes.io/name=" + LBDaemonSet

// LBPods lists the ebb lb pods, terminating ones included.
func LBPods(ctx context.Context, c *localcluster.Cluster) ([]corev1.Pod, error) {
	pods, err := c.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: LBPodSelector})
	if err != nil {
		return nil, fmt.Errorf("listing the ebb lb pods: %w", err)
	}
	return pods.Items, nil
}

// WaitLBPodsGone waits until none of the old ebb lb pods is left (they
// may serve their established connections for a while after their
// successors are ready).
func WaitLBPodsGone(ctx context.Context, c *localcluster.Cluster, old []corev1.Pod) error {
	var left []string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pods, err := LBPods(ctx, c)
		if err != nil {
			return false, nil
		}
		left = left[:0]
		for _, p := range pods {
			if slices.ContainsFunc(old, func(o corev1.Pod) bool { return o.UID == p.UID }) {
				left = append(left, p.Name)
			}
		}
		return len(left) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the old ebb lb pods to go (left: %v): %w", left, err)
	}
	return nil
}
