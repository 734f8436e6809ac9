// Package spot turns a spot preemption signal into a durable draining
// taint (seed 000, section 3): the first PreemptScheduled Event about a
// node patches the node with `ebb.dev/draining=spot-eviction:NoSchedule`
// (the key is configurable: a cluster on Azure uses
// cloudprovider.azure.microsoft.com/draining), and every load balancer then
// stops sending the node new connections. The taint is the state: a
// controller restart neither loses the signal nor repeats it, because the
// node also records which event it acted on.
//
// A node leaving takes traffic away from it, so the signal is trusted only
// from where a namespace user cannot write it (trust.go), and never takes
// the last serving load-balancer host away (package lbhost).
package spot

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbhost"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// TaintValue is the draining taint's value for a spot eviction.
const TaintValue = lbmodel.SpotEvictionValue

// heldRetry is how often an Event held back for the last load-balancer
// host is looked at again, so that the node is marked leaving once
// another host serves.
const heldRetry = 10 * time.Second

// +kubebuilder:rbac:groups="",resources=events,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=loadbalancerreports,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// Reconciler reconciles PreemptScheduled Events.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Metrics  *Metrics
	// TaintKey is the draining taint to add (lbmodel.TaintDraining).
	TaintKey string
	// TrustedSources are the emitters (source.component or
	// reportingController) whose Events are acted on;
	// DefaultTrustedSources when empty.
	TrustedSources []string
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Model holds the leaving rules (--ignore-autoscaler-taint), for which
	// LB hosts are leaving already.
	Model lbmodel.Options
	// LBNamespace is where ebb lb's DaemonSet runs (lbhost.ListPods:
	// lbhost.DefaultNamespace when empty).
	LBNamespace string

	// held is what was last said of each Event held for the last
	// load-balancer host, so that the look every heldRetry says it once
	// (and again only when the serving hosts change).
	heldMu sync.Mutex
	held   map[types.NamespacedName]string
}

// sayHeld reports whether the hold of ev, for these hosts, is news.
func (r *Reconciler) sayHeld(ev types.NamespacedName, stranded []string) bool {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	key := strings.Join(stranded, ",")
	if r.held[ev] == key {
		return false
	}
	if r.held == nil {
		r.held = map[types.NamespacedName]string{}
	}
	r.held[ev] = key
	return true
}

// forgetHeld drops what was said of ev: it is acted on, or gone.
func (r *Reconciler) forgetHeld(ev types.NamespacedName) {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	delete(r.held, ev)
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
		if apierrors.IsNotFound(err) {
			r.forgetHeld(req.NamespacedName)
		}
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
	sources := r.TrustedSources
	if len(sources) == 0 {
		sources = DefaultTrustedSources
	}
	if result, why := untrusted(ev, sources); result != "" {
		r.Metrics.count(result)
		event.Publish(r.Recorder, signalRefused(node, ev, why))
		logger.Info("Ignored a PreemptScheduled Event from an untrusted place", "why", why)
		return ctrl.Result{}, nil
	}
	if aboutEarlierNode(ev, node) {
		r.Metrics.count(refusedEarlierNode)
		return ctrl.Result{}, nil
	}
	if !newer(ev, node.Annotations[lbmodel.SpotHandledAnnotation]) {
		r.Metrics.count(resultHandled) // acted on already, or older than what was
		return ctrl.Result{}, nil
	}
	replaced, leaving := spotTaint(node.Spec.Taints, r.TaintKey)
	if !leaving {
		s, err := r.lastLBHost(ctx, node)
		if err != nil {
			return ctrl.Result{}, err
		}
		if s.Strands() {
			if r.sayHeld(req.NamespacedName, s.Stranded) {
				r.Metrics.count(resultLastLBHost)
				event.Publish(r.Recorder, heldForLastLBHost(node, ev, s))
				logger.Info("Not marking the last load-balancer host leaving for a spot eviction", "serving", s.Stranded)
			}
			return ctrl.Result{RequeueAfter: heldRetry}, nil
		}
	}
	r.forgetHeld(req.NamespacedName)
	// The node records the newest Event acted on, also when it is leaving
	// already, so that a duplicate does not taint it again once the taint
	// is cleared. The optimistic lock keeps a taint written meanwhile
	// (out-of-service, the autoscaler's): a merge patch replaces the whole
	// list.
	patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[lbmodel.SpotHandledAnnotation] = ev.CreationTimestamp.UTC().Format(time.RFC3339)
	if !leaving {
		node.Spec.Taints = withSpotTaint(node.Spec.Taints, r.TaintKey)
	}
	if err := r.Client.Patch(ctx, node, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("tainting node %s for a spot eviction: %w", node.Name, err)
	}
	if leaving {
		r.Metrics.count(resultHandled)
		return ctrl.Result{}, nil
	}
	r.Metrics.count(resultTainted)
	event.Publish(r.Recorder, taintedForSpotEviction(node, ev, r.TaintKey, replaced))
	logger.Info("Tainted a node scheduled for spot eviction", "taint", r.TaintKey)
	return ctrl.Result{}, nil
}

// lastLBHost asks whether marking node leaving would leave no serving ebb
// lb, counting the nodes leaving already as gone.
func (r *Reconciler) lastLBHost(ctx context.Context, node *corev1.Node) (lbhost.Stranding, error) {
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes); err != nil {
		return lbhost.Stranding{}, fmt.Errorf("listing nodes: %w", err)
	}
	gone := map[string]bool{node.Name: true}
	for i := range nodes.Items {
		if leaving, _ := lbmodel.IsLeaving(&nodes.Items[i], r.Model); leaving {
			gone[nodes.Items[i].Name] = true
		}
	}
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	return lbhost.Survey(ctx, r.Client, r.LBNamespace, metav1.NewTime(now()), func(n string) bool { return gone[n] })
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

// spotTaint looks for the spot taint under key: leaving when the node
// carries it with a value that marks a node leaving (for Azure's key only
// spot-eviction does, lbmodel.IsLeaving), and otherwise the value of a
// NoSchedule taint of that key that withSpotTaint will replace.
func spotTaint(taints []corev1.Taint, key string) (replaced string, leaving bool) {
	for _, t := range taints {
		if t.Key != key {
			continue
		}
		if key != lbmodel.TaintAzureDraining || t.Value == TaintValue {
			return "", true
		}
		if t.Effect == corev1.TaintEffectNoSchedule {
			replaced = t.Value
		}
	}
	return replaced, false
}

// withSpotTaint is taints with key=spot-eviction:NoSchedule in place of any
// NoSchedule taint of that key (the API allows one per key and effect).
func withSpotTaint(taints []corev1.Taint, key string) []corev1.Taint {
	out := make([]corev1.Taint, 0, len(taints)+1)
	for _, t := range taints {
		if t.Key == key && t.Effect == corev1.TaintEffectNoSchedule {
			continue
		}
		out = append(out, t)
	}
	return append(out, corev1.Taint{Key: key, Value: TaintValue, Effect: corev1.TaintEffectNoSchedule})
}
