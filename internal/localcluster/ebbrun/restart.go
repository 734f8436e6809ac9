package ebbrun

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/ebbdev/ebb/internal/localcluster"
)

// NodeAgentDaemonSet is dist/install.yaml's node-agent DaemonSet.
const NodeAgentDaemonSet = "ebb-node-agent"

// RestartAll restarts the controller, every ebb lb and every node-agent,
// as `kubectl -n ebb-system rollout restart deployment/ebb-controller
// daemonset/ebb-lb daemonset/ebb-node-agent` does (what a user runs after
// editing a ConfigMap that all three read), and waits until each runs
// only new, ready pods and a controller replica leads.
func RestartAll(ctx context.Context, c *localcluster.Cluster) error {
	oldLB, err := LBPods(ctx, c)
	if err != nil {
		return err
	}
	patch := restartPatch()
	if _, err := c.Client.AppsV1().Deployments(Namespace).Patch(ctx, controllerDeployment, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("restarting the controller: %w", err)
	}
	if _, err := c.Client.AppsV1().DaemonSets(Namespace).Patch(ctx, NodeAgentDaemonSet, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("restarting the node-agent: %w", err)
	}
	if err := RolloutRestartLB(ctx, c); err != nil {
		return err
	}
	if err := WaitControllerRolledOut(ctx, c); err != nil {
		return err
	}
	if err := WaitLBReplaced(ctx, c, oldLB); err != nil {
		return err
	}
	return waitDaemonSetRolledOut(ctx, c, NodeAgentDaemonSet)
}

// waitDaemonSetRolledOut waits until a DaemonSet's every scheduled pod is
// of its current template and available, as `kubectl rollout status` does.
func waitDaemonSetRolledOut(ctx context.Context, c *localcluster.Cluster, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var last string
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		ds, err := c.Client.AppsV1().DaemonSets(Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		s := ds.Status
		last = fmt.Sprintf("%d of %d pods updated, %d available", s.UpdatedNumberScheduled, s.DesiredNumberScheduled, s.NumberAvailable)
		return s.ObservedGeneration >= ds.Generation && s.UpdatedNumberScheduled == s.DesiredNumberScheduled && s.NumberAvailable == s.DesiredNumberScheduled, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for DaemonSet %s's rollout (%s): %w", name, last, err)
	}
	return nil
}
