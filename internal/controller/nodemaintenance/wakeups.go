package nodemaintenance

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// Which event wakes which maintenance. Every reconcile reads all
// maintenances and nodes from the cache, so a wake-up is cheap but not
// free, and a woken maintenance that finds a change writes: on a cluster
// of thousands of pods, waking every maintenance on every pod event is
// what made reconciles grow with the cluster. So:
//   - a change of a maintenance wakes every maintenance in Cordon or
//     Drain: drain targets of a node depend on all maintenances on it,
//     and maintenances are few;
//   - a node wakes the maintenances in Cordon or Drain that select it, or
//     that still list it in their status (it may have just left the
//     selector and must be released);
//   - a pod, and an Evacuation through its pod, wakes the maintenances in
//     Drain of the pod's node; a pod that has no node concerns none;
//   - a node also wakes the maintenances that wait for a drain slot
//     (slots.go): a node that finished draining frees one;
//   - a load-balancer report wakes every maintenance in Drain: one report
//     covers every node the replica serves.
//
// Idle and Complete maintenances are woken only by their own changes:
// Complete's work is done once, and a node another maintenance still held
// is released by that one's Complete. A maintenance being deleted is
// always woken (it moves to Complete).

// maintenancesIn maps any event to the maintenances in one of stages, and
// to those being deleted.
func (r *Reconciler) maintenancesIn(stages ...v1alpha1.NodeMaintenanceStage) handler.MapFunc {
	return func(ctx context.Context, _ client.Object) []reconcile.Request {
		var list v1alpha1.NodeMaintenanceList
		if err := r.Client.List(ctx, &list); err != nil {
			return nil
		}
		var out []reconcile.Request
		for _, nm := range list.Items {
			if wakeable(&nm, stages) {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&nm)})
			}
		}
		return out
	}
}

// maintenancesOf maps an event to the maintenances in one of stages (or
// being deleted) that concern the event's node: they select it, or their
// status lists it; with alsoWaiting, to those waiting for a drain slot too.
func (r *Reconciler) maintenancesOf(nodeOf func(context.Context, client.Object) string, alsoWaiting bool, stages ...v1alpha1.NodeMaintenanceStage) handler.MapFunc {
	return func(ctx context.Context, obj client.Object) []reconcile.Request {
		name := nodeOf(ctx, obj)
		if name == "" {
			return nil
		}
		var list v1alpha1.NodeMaintenanceList
		if err := r.Client.List(ctx, &list); err != nil {
			return nil
		}
		node := &corev1.Node{}
		if err := r.Client.Get(ctx, types.NamespacedName{Name: name}, node); err != nil {
			node = nil // gone: only the maintenances that list it care
		}
		var out []reconcile.Request
		for _, nm := range list.Items {
			if wakeable(&nm, stages) && (concerns(&nm, name, node) || alsoWaiting && waitingForSlot(&nm)) {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&nm)})
			}
		}
		return out
	}
}

func wakeable(nm *v1alpha1.NodeMaintenance, stages []v1alpha1.NodeMaintenanceStage) bool {
	return slices.Contains(stages, nm.Spec.Stage) || nm.DeletionTimestamp != nil
}

// concerns reports whether nm has to look at the node called name: it
// selects the node (nil when the node is gone), or its status still lists
// it.
func concerns(nm *v1alpha1.NodeMaintenance, name string, node *corev1.Node) bool {
	for _, ns := range nm.Status.NodeStatuses {
		if ns.NodeRef.Name == name {
			return true
		}
	}
	if node == nil {
		return false
	}
	sel, err := nodeaffinity.NewNodeSelector(nm.Spec.NodeSelector)
	return err == nil && sel.Match(node)
}

func nodeOfNode(_ context.Context, obj client.Object) string { return obj.GetName() }

func nodeOfPod(_ context.Context, obj client.Object) string {
	if p, ok := obj.(*corev1.Pod); ok {
		return p.Spec.NodeName
	}
	return ""
}

// nodeOfEvacuation is the node of the Evacuation's pod. An Evacuation
// whose pod is gone concerns no node: the pod's deletion already woke the
// maintenances of its node.
func (r *Reconciler) nodeOfEvacuation(ctx context.Context, obj client.Object) string {
	e, ok := obj.(*v1alpha1.Evacuation)
	if !ok {
		return ""
	}
	pod := &corev1.Pod{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: e.Namespace, Name: e.Spec.PodRef.Name}, pod); err != nil {
		return ""
	}
	return pod.Spec.NodeName
}
