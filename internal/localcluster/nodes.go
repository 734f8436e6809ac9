package localcluster

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// ReplaceNode deletes a simulated node and registers a new one with the
// same name and address, as happens when a machine is reimaged or a spot
// VM comes back: the new node has a new UID and none of the old one's
// taints or annotations. It returns once the new node is Ready.
func (c *Cluster) ReplaceNode(ctx context.Context, name string) (*corev1.Node, error) {
	var spec *Node
	for i := range c.Nodes {
		if c.Nodes[i].Name == name {
			spec = &c.Nodes[i]
		}
	}
	if spec == nil {
		return nil, fmt.Errorf("replacing node %s: not a node of this cluster", name)
	}
	nodes := c.Client.CoreV1().Nodes()
	if err := nodes.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("deleting node %s: %w", name, err)
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := nodes.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for node %s to be deleted: %w", name, err)
	}
	if _, err := nodes.Create(ctx, nodeObject(*spec), metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("registering node %s again: %w", name, err)
	}
	var node *corev1.Node
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				node = n
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for the new node %s to be Ready: %w", name, err)
	}
	return node, nil
}
