// Package adminstate reports the load-balancer admin state of each node as
// Node events, exactly once per transition: the leader-elected controller
// emits them (not every `ebb lb` replica for every Service), and the node
// records the state last reported, so a restart does not repeat them. It
// also warns on a node the load balancers leave out because another node
// gives its address (duplicates.go).
package adminstate

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// Event reasons of the admin-state design (seed 000).
const (
	ReasonDown = lbmodel.ReasonAdminStateDown
	ReasonNone = lbmodel.ReasonAdminStateNone
)

// ReportedAnnotation records on the node the admin state last reported.
const ReportedAnnotation = "ebb.dev/load-balancer-admin-state"

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch

// Reconciler reports nodes' admin state transitions.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Model    lbmodel.Options

	duplicates duplicateReports
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Node{}, InternalIPIndex, IndexInternalIPs); err != nil {
		return fmt.Errorf("indexing nodes by InternalIP: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).Named("adminstate-events").For(&corev1.Node{}).Complete(r)
}

// Reconcile emits an event when a node's admin state differs from the one
// last reported, then records it.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, req.NamespacedName, node); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if err := r.reportDuplicates(ctx, node); err != nil {
		return ctrl.Result{}, err
	}
	state := lbmodel.NodeAdminState(node, r.Model)
	reported := lbmodel.AdminState(node.Annotations[ReportedAnnotation])
	if reported == "" {
		reported = lbmodel.AdminNone // nodes start in rotation: nothing to report
	}
	if state == reported {
		return ctrl.Result{}, nil
	}
	patch := client.MergeFrom(node.DeepCopy())
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[ReportedAnnotation] = string(state)
	if err := r.Client.Patch(ctx, node, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("recording the admin state of %s: %w", node.Name, err)
	}
	if state == lbmodel.AdminDown {
		_, taint := lbmodel.IsLeaving(node, r.Model)
		event.Publish(r.Recorder, nodeDown(node, taint))
	} else {
		event.Publish(r.Recorder, nodeBack(node))
	}
	log.FromContext(ctx).Info("Reported a node's load-balancer admin state", "node", klog.KObj(node), "state", state)
	return ctrl.Result{}, nil
}
