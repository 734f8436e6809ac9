package ebbrun

import (
	"context"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/ebbdev/ebb/internal/localcluster"
)

// SetLBNode makes a node an LB node (the label config/lb's DaemonSet
// selects) or takes that away, as a user does with kubectl label.
func SetLBNode(ctx context.Context, c *localcluster.Cluster, node string, lb bool) error {
	value := "null"
	if lb {
		value = `"true"`
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, LBNodeLabel, value)
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling node %s for ebb lb: %w", node, err)
	}
	return nil
}

// UpdateLBArgs edits the arguments of the installed ebb lb DaemonSet's
// container, as a user's kubectl edit would, and waits until every LB node
// runs a new, ready ebb lb (each new pod takes its predecessor's listeners
// over, config/lb; the old one may still be finishing its connections).
func UpdateLBArgs(ctx context.Context, c *localcluster.Cluster, edit func(args []string) []string) error {
	old, err := LBPods(ctx, c)
	if err != nil {
		return err
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ds, err := c.Client.AppsV1().DaemonSets(Namespace).Get(ctx, LBDaemonSet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		containers := ds.Spec.Template.Spec.Containers
		if len(containers) == 0 {
			return fmt.Errorf("the DaemonSet %s has no container", LBDaemonSet)
		}
		containers[0].Args = edit(slices.Clone(containers[0].Args))
		_, err = c.Client.AppsV1().DaemonSets(Namespace).Update(ctx, ds, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("updating ebb lb's arguments: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	return WaitLBReplaced(ctx, c, old)
}
