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

// ReplaceNode deletes a node and registers a new one with the same name
// and address, as happens when a machine is reimaged or a spot VM comes
// back: the new node has a new UID and none of the old one's taints or
// annotations. A real node is rebooted once its Node object is gone, and
// its kubelet registers it again with a new UID; unlike a reimaged
// machine it keeps its state on disk, so pods still bound to its name
// start again (a test that wants none evicts them first). A simulated
// one is created again here. It returns once the new node is
// Ready.
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
	if c.RealKubelets() {
		if err := c.RebootNode(ctx, name, 0); err != nil {
			return nil, fmt.Errorf("replacing node %s: %w", name, err)
		}
	} else if _, err := nodes.Create(ctx, nodeObject(*spec), metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("registering node %s again: %w", name, err)
	}
	var node *corev1.Node
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if err != nil || !NodeReady(n) {
			return false, nil
		}
		node = n
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for the new node %s to be Ready: %w", name, err)
	}
	return node, nil
}

// AddBareNodes registers n more simulated nodes, named prefix-0 onwards,
// with labels and without a host: no network namespace, no kube-proxy, no
// pod servers. kwok makes them Ready and runs their pods' lifecycle, so
// they serve control-plane scale figures (many nodes, thousands of pods);
// their pods should use the host network, which the pod servers leave
// alone. It returns the names once every node is Ready.
func (c *Cluster) AddBareNodes(ctx context.Context, prefix string, n int, labels map[string]string) ([]string, error) {
	if n > 150 {
		return nil, fmt.Errorf("adding %d bare nodes: at most 150 fit the pod CIDR next to the cluster's own", n)
	}
	var names []string
	for i := range n {
		spec := Node{Name: fmt.Sprintf("%s-%d", prefix, i), IP: fmt.Sprintf("10.250.%d.%d", i/250, 1+i%250), PodCIDR: fmt.Sprintf("10.244.%d.0/24", 100+i)}
		obj := nodeObject(spec)
		for k, v := range labels {
			obj.Labels[k] = v
		}
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("registering bare node %s: %w", spec.Name, err)
		}
		names = append(names, spec.Name)
	}
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, name := range names {
			node, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil || !NodeReady(node) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for %d bare nodes to be Ready: %w", n, err)
	}
	return names, nil
}

// NodeReady reports whether the node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}
