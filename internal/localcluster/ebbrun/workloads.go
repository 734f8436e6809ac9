package ebbrun

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

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

// UpdateControllerArgs edits the arguments of the installed controller's
// container, as a user's kubectl edit would, and waits until the rollout
// is over (every replica of the new spec Ready, none of the old left) and
// a new replica leads: only then do the new arguments rule what the
// controller does.
func UpdateControllerArgs(ctx context.Context, c *localcluster.Cluster, edit func(args []string) []string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := c.Client.AppsV1().Deployments(Namespace).Get(ctx, controllerDeployment, metav1.GetOptions{})
		if err != nil {
			return err
		}
		containers := d.Spec.Template.Spec.Containers
		if len(containers) == 0 {
			return fmt.Errorf("the Deployment %s has no container", controllerDeployment)
		}
		containers[0].Args = edit(slices.Clone(containers[0].Args))
		_, err = c.Client.AppsV1().Deployments(Namespace).Update(ctx, d, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("updating the controller's arguments: %w", err)
	}
	return WaitControllerRolledOut(ctx, c)
}

// WaitControllerRolledOut waits until the controller's Deployment runs
// only pods of its current spec, all Ready, and one of them holds the
// leader Lease.
func WaitControllerRolledOut(ctx context.Context, c *localcluster.Cluster) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var last string
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		d, err := c.Client.AppsV1().Deployments(Namespace).Get(ctx, controllerDeployment, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		want := ptrValue(d.Spec.Replicas)
		if !deploymentReady(d) || d.Status.Replicas != want {
			last = fmt.Sprintf("%d of %d replicas updated, %d ready, %d in all", d.Status.UpdatedReplicas, want, d.Status.ReadyReplicas, d.Status.Replicas)
			return false, nil
		}
		pods, err := c.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + controllerDeployment})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		lease, err := c.Client.CoordinationV1().Leases(Namespace).Get(ctx, controllerDeployment, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		holder, _, _ := strings.Cut(ptr.Deref(lease.Spec.HolderIdentity, ""), "_")
		for _, p := range pods.Items {
			if p.Name == holder && p.DeletionTimestamp == nil {
				return true, nil
			}
		}
		last = fmt.Sprintf("the Lease is held by %q, no current replica", holder)
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the controller's rollout (%s): %w", last, err)
	}
	return nil
}

// ScaleController scales the controller's Deployment, as kubectl scale
// does, and waits until no pod is left (0) or the rollout is over and a
// replica leads.
func ScaleController(ctx context.Context, c *localcluster.Cluster, replicas int32) error {
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	if _, err := c.Client.AppsV1().Deployments(Namespace).Patch(ctx, controllerDeployment, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("scaling the controller to %d: %w", replicas, err)
	}
	if replicas > 0 {
		return WaitControllerRolledOut(ctx, c)
	}
	return wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + controllerDeployment})
		return err == nil && len(pods.Items) == 0, nil
	})
}

// controllerDeployment names config/manager's Deployment (and its Lease).
const controllerDeployment = "ebb-controller"

// InstallOnNode installs ebb from manifest with ebb lb and both controller
// replicas on node, an infrastructure node that suites draining, tainting
// and replacing the others never move ebb off, and routes both VIP pools
// to it (RouteVIPsTo). The node is tainted (InfraTaintKey, NoSchedule), as dedicated
// infrastructure nodes are, so that the suites' applications never land
// on it (a test draining an application's node would drain ebb's), and
// ebb's workloads tolerate the taint.
func InstallOnNode(ctx context.Context, c *localcluster.Cluster, manifest string, node localcluster.Node) error {
	infra := corev1.Taint{Key: InfraTaintKey, Effect: corev1.TaintEffectNoSchedule}
	if err := taintNode(ctx, c, node.Name, infra); err != nil {
		return err
	}
	tolerate := corev1.Toleration{Key: infra.Key, Operator: corev1.TolerationOpExists, Effect: infra.Effect}
	err := InstallManifest(ctx, c, manifest, ManifestOptions{
		LBNodes: []string{node.Name},
		EditController: func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node.Name}
			d.Spec.Template.Spec.Tolerations = append(d.Spec.Template.Spec.Tolerations, tolerate)
		},
		EditLB: func(d *appsv1.DaemonSet) {
			d.Spec.Template.Spec.Tolerations = append(d.Spec.Template.Spec.Tolerations, tolerate)
		},
	})
	if err != nil {
		return err
	}
	return RouteVIPsTo(c, node)
}

// InfraTaintKey is the key of the NoSchedule taint that keeps everything
// but ebb off InstallOnNode's node.
const InfraTaintKey = "node-role.kubernetes.io/infra"

// taintNode adds taint to node (no-op when it has it).
func taintNode(ctx context.Context, c *localcluster.Cluster, node string, taint corev1.Taint) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading node %s: %w", node, err)
		}
		for _, t := range n.Spec.Taints {
			if t.MatchTaint(&taint) {
				return nil
			}
		}
		n.Spec.Taints = append(n.Spec.Taints, taint)
		_, err = c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// RouteVIPsTo routes both VIP pools to node, where ebb lb serves them, from
// the router and from the control-plane host (where tests' clients run).
func RouteVIPsTo(c *localcluster.Cluster, node localcluster.Node) error {
	v4, v6 := netip.MustParseAddr(node.IP), netip.MustParseAddr(node.IPv6)
	if err := c.RouteVIPsVia(v4, v6); err != nil {
		return err
	}
	if err := c.Network.Root.AddRoute(localcluster.VIPPrefix, v4); err != nil {
		return err
	}
	return c.Network.Root.AddRoute(localcluster.VIPPrefixv6, v6)
}
