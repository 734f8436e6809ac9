package nodemaintenance

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/drainplan"
	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// Who cordoned a node, in v1alpha1.CordonAnnotation.
const (
	cordonedByEbb  = "ebb"
	cordonedByUser = "preexisting"
)

// cordon makes every selected node unschedulable and keeps it so.
func (r *Reconciler) cordon(ctx context.Context, nm *v1alpha1.NodeMaintenance, w *world) error {
	for _, name := range w.selected[nm.Name] {
		node := w.node(name)
		if node.Spec.Unschedulable && node.Annotations[v1alpha1.CordonAnnotation] != "" {
			continue
		}
		patch := client.MergeFrom(node.DeepCopy())
		if node.Annotations == nil {
			node.Annotations = map[string]string{}
		}
		switch {
		case node.Spec.Unschedulable:
			node.Annotations[v1alpha1.CordonAnnotation] = cordonedByUser
		case node.Annotations[v1alpha1.CordonAnnotation] != "":
			// Someone uncordoned a node under maintenance.
			node.Spec.Unschedulable = true
			node.Annotations[v1alpha1.CordonAnnotation] = cordonedByEbb
			event.Publish(r.Recorder, recordoned(nm, node))
		default:
			node.Spec.Unschedulable = true
			node.Annotations[v1alpha1.CordonAnnotation] = cordonedByEbb
		}
		if err := r.Client.Patch(ctx, node, patch); err != nil {
			return fmt.Errorf("cordoning node %s: %w", name, err)
		}
		log.FromContext(ctx).Info("Cordoned", "node", klog.KObj(node))
	}
	return nil
}

// taint adds ebb.dev/draining=maintenance:NoSchedule to every selected
// node (unless it carries the key already, e.g. from a spot eviction): the
// load balancers stop sending it new connections, and the DaemonSet
// controller stops recreating evicted daemon pods there.
func (r *Reconciler) taint(ctx context.Context, nm *v1alpha1.NodeMaintenance, w *world) error {
	for _, name := range w.selected[nm.Name] {
		node := w.node(name)
		if hasTaint(node, lbmodel.TaintDraining) {
			continue
		}
		patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
		node.Spec.Taints = append(node.Spec.Taints, drainplan.DrainingTaint())
		if err := r.Client.Patch(ctx, node, patch); err != nil {
			return fmt.Errorf("tainting node %s draining: %w", name, err)
		}
		log.FromContext(ctx).Info("Tainted draining", "node", klog.KObj(node))
	}
	return nil
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

// complete removes this maintenance's Evacuations and, on nodes no other
// maintenance still holds, its cordon and then its draining taint: the
// node returns to load-balancer rotation only once it is schedulable again
// (a cordon someone else set stays).
func (r *Reconciler) complete(ctx context.Context, nm *v1alpha1.NodeMaintenance, w *world) error {
	if err := r.releaseEvacuations(ctx, nm, w); err != nil {
		return err
	}
	return r.releaseNodes(ctx, nm, w, w.selected[nm.Name])
}

// leftNodes are the nodes this maintenance had (its status lists them)
// that its selector no longer selects: a node relabelled, or a selector
// matching on something that changed.
func leftNodes(nm *v1alpha1.NodeMaintenance, w *world) []string {
	var out []string
	for _, ns := range nm.Status.NodeStatuses {
		if !slices.Contains(w.selected[nm.Name], ns.NodeRef.Name) && w.node(ns.NodeRef.Name) != nil {
			out = append(out, ns.NodeRef.Name)
		}
	}
	return out
}

// releaseNodes takes ebb's cordon and then its draining taint off each of
// names that no other maintenance in Cordon or Drain holds.
func (r *Reconciler) releaseNodes(ctx context.Context, nm *v1alpha1.NodeMaintenance, w *world, names []string) error {
	for _, name := range names {
		node := w.node(name)
		if len(w.covering(name, nm.Name, v1alpha1.Cordon, v1alpha1.Drain)) > 0 {
			continue
		}
		released := false
		if node.Annotations[v1alpha1.CordonAnnotation] != "" {
			patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
			if node.Annotations[v1alpha1.CordonAnnotation] == cordonedByEbb {
				node.Spec.Unschedulable = false
			}
			delete(node.Annotations, v1alpha1.CordonAnnotation)
			if err := r.Client.Patch(ctx, node, patch); err != nil {
				return fmt.Errorf("uncordoning node %s: %w", name, err)
			}
			released = true
		}
		if hasTaintValue(node, lbmodel.TaintDraining, v1alpha1.DrainingTaintValue) {
			patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
			var kept []corev1.Taint
			for _, t := range node.Spec.Taints {
				if t.Key != lbmodel.TaintDraining || t.Value != v1alpha1.DrainingTaintValue {
					kept = append(kept, t)
				}
			}
			node.Spec.Taints = kept
			if err := r.Client.Patch(ctx, node, patch); err != nil {
				return fmt.Errorf("removing the draining taint from node %s: %w", name, err)
			}
			released = true
		}
		if released {
			event.Publish(r.Recorder, nodeReleased(nm, node))
			log.FromContext(ctx).Info("Released", "node", klog.KObj(node), "schedulable", !node.Spec.Unschedulable)
		}
	}
	return nil
}

func hasTaintValue(n *corev1.Node, key, value string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key && t.Value == value {
			return true
		}
	}
	return false
}

// publishNodeConditions sets MaintenanceInProgress, DrainInProgress and
// Drained on the nodes of this maintenance, and on those that just left it,
// from every maintenance on them: whichever maintenance is reconciled
// computes the same conditions, so that two on one node do not flip them
// back and forth (each write wakes both).
func (r *Reconciler) publishNodeConditions(ctx context.Context, w *world, drain *drainResult, nm *v1alpha1.NodeMaintenance, left []string) error {
	for _, name := range slices.Concat(w.selected[nm.Name], left) {
		node := w.node(name)
		active := w.covering(name, "", v1alpha1.Cordon, v1alpha1.Drain)
		draining := w.covering(name, "", v1alpha1.Drain)
		drained := w.drainedByAll(name, draining, nm.Name, drain)
		want := []corev1.NodeCondition{
			condition(v1alpha1.NodeConditionMaintenanceInProgress, len(active) > 0, "MaintenanceActive", "NoMaintenance", fmt.Sprintf("NodeMaintenance %v", active)),
			condition(v1alpha1.NodeConditionDrainInProgress, len(draining) > 0 && !drained, "Draining", "NotDraining", fmt.Sprintf("NodeMaintenance %v", draining)),
			condition(v1alpha1.NodeConditionDrained, len(draining) > 0 && drained, "Drained", "NotDrained", fmt.Sprintf("NodeMaintenance %v", draining)),
		}
		orig := node.DeepCopy()
		changed := false
		for _, c := range want {
			if setNodeCondition(node, c, metav1.NewTime(r.Clock.Now())) {
				changed = true
			}
		}
		if !changed {
			continue
		}
		if err := r.Client.Status().Patch(ctx, node, client.StrategicMergeFrom(orig)); err != nil {
			return fmt.Errorf("publishing maintenance conditions on node %s: %w", name, err)
		}
	}
	return nil
}

func condition(typ string, on bool, yes, no, msg string) corev1.NodeCondition {
	c := corev1.NodeCondition{Type: corev1.NodeConditionType(typ), Status: corev1.ConditionFalse, Reason: no}
	if on {
		c.Status, c.Reason, c.Message = corev1.ConditionTrue, yes, msg
	}
	return c
}

// setNodeCondition sets c on node, keeping the transition time when the
// status did not change; it reports whether anything changed. A condition
// that would be False and is absent is not added.
func setNodeCondition(node *corev1.Node, c corev1.NodeCondition, now metav1.Time) bool {
	for i, old := range node.Status.Conditions {
		if old.Type != c.Type {
			continue
		}
		if old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message {
			return false
		}
		c.LastTransitionTime = old.LastTransitionTime
		if old.Status != c.Status {
			c.LastTransitionTime = now
		}
		c.LastHeartbeatTime = now
		node.Status.Conditions[i] = c
		return true
	}
	if c.Status == corev1.ConditionFalse {
		return false
	}
	c.LastTransitionTime, c.LastHeartbeatTime = now, now
	node.Status.Conditions = append(node.Status.Conditions, c)
	return true
}

// drainedByAll reports whether every maintenance in draining (at least
// one) is done with node: self from its drain just now, the others from
// the status they last recorded.
func (w *world) drainedByAll(node string, draining []string, self string, drain *drainResult) bool {
	for _, name := range draining {
		if name == self {
			if !drain.nodeDrained(node) {
				return false
			}
			continue
		}
		i := slices.IndexFunc(w.maintenances, func(m v1alpha1.NodeMaintenance) bool { return m.Name == name })
		if s := oldNodeStatus(&w.maintenances[i], node); s == nil || !s.Drained {
			return false
		}
	}
	return len(draining) > 0
}
