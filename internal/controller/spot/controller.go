// Package spot turns a spot preemption signal into a durable draining
// taint (seed 000, section 3): the first PreemptScheduled Event about a
// node patches the node with `ebb.dev/draining=spot-eviction:NoSchedule`
// (the key is configurable: a cluster on Azure uses
// cloudprovider.azure.microsoft.com/draining), and every load balancer then
// stops sending the node new connections. The taint is the state: a
// controller restart neither loses the signal nor repeats it, because the
// node also records which event it acted on.
package spot

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// TaintValue is the draining taint's value for a spot eviction.
const TaintValue = lbmodel.SpotEvictionValue

// +kubebuilder:rbac:groups="",resources=events,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch

// Reconciler reconciles PreemptScheduled Events.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// TaintKey is the draining taint to add (lbmodel.TaintDraining).
	TaintKey string
}

// isPreemption selects PreemptScheduled Events about Nodes.
func isPreemption(obj client.Object) bool {
	ev, ok := obj.(*corev1.Event)
	return ok && ev.Reason == lbmodel.ReasonPreemptScheduled && ev.InvolvedObject.Kind == "Node"
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.TaintKey == "" {
		r.TaintKey = lbmodel.TaintDraining
	}
	return ctrl.NewControllerManagedBy(mgr).Named("spot-preemption").
		For(&corev1.Event{}, builder.WithPredicates(predicate.NewPredicateFuncs(isPreemption))).
		Complete(r)
}

// Reconcile taints the node of one PreemptScheduled Event, once.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ev := &corev1.Event{}
	if err := r.Client.Get(ctx, req.NamespacedName, ev); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !isPreemption(ev) {
		return ctrl.Result{}, nil
	}
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: ev.InvolvedObject.Name}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil // the node is gone already
		}
		return ctrl.Result{}, fmt.Errorf("getting node %s: %w", ev.InvolvedObject.Name, err)
	}
	logger := log.FromContext(ctx).WithValues("node", klog.KObj(node), "event", klog.KObj(ev))
	switch {
	case ev.InvolvedObject.UID != "" && ev.InvolvedObject.UID != node.UID:
		// About an earlier node of the same name: not this one.
		return ctrl.Result{}, nil
	case !newer(ev, node.Annotations[lbmodel.SpotHandledAnnotation]):
		return ctrl.Result{}, nil // acted on already, or older than what was
	}
	patch := client.MergeFrom(node.DeepCopy())
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[lbmodel.SpotHandledAnnotation] = ev.CreationTimestamp.UTC().Format(time.RFC3339)
	tainted := hasTaint(node, r.TaintKey)
	if !tainted {
		node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: r.TaintKey, Value: TaintValue, Effect: corev1.TaintEffectNoSchedule})
	}
	if err := r.Client.Patch(ctx, node, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("tainting node %s for a spot eviction: %w", node.Name, err)
	}
	if !tainted {
		event.Publish(r.Recorder, taintedForSpotEviction(node, ev, r.TaintKey))
		logger.Info("Tainted a node scheduled for spot eviction", "taint", r.TaintKey)
	}
	return ctrl.Result{}, nil
}

// newer reports whether the event was created after the handled time.
func newer(ev *corev1.Event, handled string) bool {
	if handled == "" {
		return true
	}
	t, err := time.Parse(time.RFC3339, handled)
	if err != nil {
		return true // a damaged record: act rather than miss a preemption
	}
	return ev.CreationTimestamp.Time.Truncate(time.Second).After(t)
}

func hasTaint(node *corev1.Node, key string) bool {
	for _, t := range node.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}
