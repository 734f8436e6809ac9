package nodemaintenance

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/drainplan"
	"github.com/ebbdev/ebb/internal/evacuator"
)

// drainResult is the drain of one maintenance after a reconcile.
type drainResult struct {
	res   *resolution
	self  *drainState
	nodes map[string]*nodeDrain
}

// nodeDrain counts one node's pods.
type nodeDrain struct {
	pending, evacuating, static int
	// tolerating names the DaemonSets whose pods tolerate the draining
	// taint: evicted, they would come straight back.
	tolerating []string

	// The traffic drain (see traffic.go).
	lbDown, lbGateExpired, mayEvacuate bool
	connections                        int64
	// hostConnections are those of the ebb lb replicas running on the
	// node (an LB host); hostServing names the ones not draining yet.
	hostConnections int64
	hostServing     []string
	// unknown names the ebb lb pods running without a fresh report.
	unknown                      []string
	trafficStart                 *metav1.Time
	trafficDone, trafficTimedOut bool
	// trafficLeft is the time to the traffic-drain timeout (for requeues);
	// trafficDeadline is that timeout as a time (for the message, which
	// must not change while nothing else does).
	trafficLeft     time.Duration
	trafficDeadline time.Time
}

// nodeDrained reports whether nothing is left on node: every pod but
// static ones is gone at targets that select everything (or this
// maintenance is drained).
func (d *drainResult) nodeDrained(node string) bool {
	if d == nil || d.self == nil || d.res.remaining[node] > 0 || d.nodes[node] == nil || !d.nodes[node].trafficDone {
		return false
	}
	return d.res.drained(d.self) || !d.res.nodes[node].Level.Less(finalLevel)
}

// finalLevel targets every pod.
var finalLevel = drainplan.Level{Rank: drainplan.TypeRank(v1alpha1.Static), Priority: math.MaxInt32, General: math.MaxInt32}

// drain resolves the drain targets across maintenances, moves this one's
// plan forward when it can, and makes sure an Evacuation exists for every
// pod its nodes' targets select.
func (r *Reconciler) drain(ctx context.Context, nm *v1alpha1.NodeMaintenance, w *world) (*drainResult, error) {
	pods, err := r.podsOfDrains(ctx, w)
	if err != nil {
		return nil, err
	}
	remaining := func(node string, targets []v1alpha1.DrainPlanEntry) int {
		n := 0
		for _, p := range pods[node] {
			if !static(p) && !drainplan.ToleratesDraining(p) && drainplan.Matches(targets, p) {
				n++
			}
		}
		return n
	}
	states := drainStates(w)
	res := resolve(states, remaining)
	self := res.maintenances[nm.Name]
	out := &drainResult{res: res, self: self, nodes: map[string]*nodeDrain{}}
	if self == nil {
		return out, nil
	}
	var evacs v1alpha1.EvacuationList
	if err := r.Client.List(ctx, &evacs); err != nil {
		return nil, fmt.Errorf("listing Evacuations: %w", err)
	}
	existing := map[string]*v1alpha1.Evacuation{}
	for i := range evacs.Items {
		e := &evacs.Items[i]
		existing[e.Namespace+"/"+e.Name] = e
	}
	views, err := r.loadBalancerViews(ctx)
	if err != nil {
		return nil, err
	}
	for _, node := range self.Nodes {
		nd := &nodeDrain{}
		out.nodes[node] = nd
		r.trafficDrain(nm, node, views(node), nd)
		targets := res.nodes[node].Targets
		for _, p := range pods[node] {
			if err := r.drainPod(ctx, nm, node, p, targets, existing, nd); err != nil {
				return nil, err
			}
		}
	}
	return out, r.forgetGoneEvacuations(ctx, evacs.Items, nodesOfDrains(w))
}

// drainPod counts one pod of a draining node in nd, and asks for its
// Evacuation when the drain plan's current step targets it.
func (r *Reconciler) drainPod(ctx context.Context, nm *v1alpha1.NodeMaintenance, node string, p *corev1.Pod, targets []v1alpha1.DrainPlanEntry, existing map[string]*v1alpha1.Evacuation, nd *nodeDrain) error {
	if static(p) {
		nd.static++
		return nil
	}
	if drainplan.ToleratesDraining(p) {
		if ref := metav1.GetControllerOf(p); ref != nil && !slices.Contains(nd.tolerating, ref.Name) {
			nd.tolerating = append(nd.tolerating, ref.Name)
		}
		return nil
	}
	e := existing[p.Namespace+"/"+v1alpha1.EvacuationName(p.UID, p.Name)]
	if e != nil && e.Spec.PodRef.UID == p.UID {
		if e.DeletionTimestamp != nil && controllerutil.ContainsFinalizer(e, v1alpha1.InstigatorFinalizer) && e.Status.EvacuationCancellationPolicy != v1alpha1.CancellationForbid {
			// Someone deleted (cancelled) it while our finalizer held it:
			// nothing would evacuate the pod and the drain would wait
			// forever. Let it go; once it is gone the pod's Evacuation is
			// asked for again.
			if err := r.withdraw(ctx, e); err != nil {
				return err
			}
			log.FromContext(ctx).Info("Evacuation deleted by someone else: asking again once it is gone", "evacuation", klog.KObj(e))
			nd.pending++
			return nil
		}
		nd.evacuating++
		if !controllerutil.ContainsFinalizer(e, v1alpha1.InstigatorFinalizer) && e.DeletionTimestamp == nil && drainplan.Matches(targets, p) {
			// Adopting another instigator's request: ebb's node label goes
			// with ebb's finalizer, as Complete and the clean-up find the
			// Evacuations to withdraw from by it (without, an adopted
			// Evacuation was never released, and the pod was evicted
			// after every instigator had withdrawn).
			patch := client.MergeFrom(e.DeepCopy())
			controllerutil.AddFinalizer(e, v1alpha1.InstigatorFinalizer)
			if e.Labels == nil {
				e.Labels = map[string]string{}
			}
			e.Labels[v1alpha1.EvacuationNodeLabel] = node
			if err := r.Client.Patch(ctx, e, patch); err != nil {
				return fmt.Errorf("adding our finalizer to Evacuation %s: %w", klog.KObj(e), err)
			}
		}
		return nil
	}
	if !drainplan.Matches(targets, p) || !nd.mayEvacuate {
		nd.pending++
		return nil
	}
	if err := r.createEvacuation(ctx, nm, p, node); err != nil {
		if !apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			return err
		}
		// Its namespace is being deleted, the pod with it: no Evacuation
		// can be made there, and none is needed. Failing the pass here
		// held every other pod's progress.
		log.FromContext(ctx).V(1).Info("No Evacuation: its namespace is being deleted", "pod", klog.KObj(p))
	}
	nd.evacuating++
	return nil
}

// drained reports whether this maintenance is drained: every targeted pod
// gone and every node's traffic drained.
func (d *drainResult) drained() bool {
	if d == nil || d.self == nil || !d.res.drained(d.self) {
		return false
	}
	for _, nd := range d.nodes {
		if !nd.trafficDone {
			return false
		}
	}
	return true
}

// requeueAfter is when the drain must be looked at again without an event
// (a traffic-drain timeout, the load-balancer gate).
func (d *drainResult) requeueAfter() time.Duration {
	next := drainResync
	if d == nil {
		return next
	}
	for _, nd := range d.nodes {
		if nd.trafficLeft > 0 {
			next = min(next, nd.trafficLeft)
		}
		if !nd.lbDown && !nd.lbGateExpired {
			next = min(next, time.Second)
		}
	}
	return next
}

// podsOfDrains lists, by node, the pods that have not finished on every
// node under a maintenance in Drain (drain targets depend on all of them).
func (r *Reconciler) podsOfDrains(ctx context.Context, w *world) (map[string][]*corev1.Pod, error) {
	pods := map[string][]*corev1.Pod{}
	for _, name := range nodesOfDrains(w) {
		var list corev1.PodList
		if err := r.Client.List(ctx, &list, client.MatchingFields{podNodeIndex: name}); err != nil {
			return nil, fmt.Errorf("listing the pods of node %s: %w", name, err)
		}
		for i := range list.Items {
			p := &list.Items[i]
			if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				pods[name] = append(pods[name], p)
			}
		}
	}
	return pods, nil
}

// nodesOfDrains lists every node under a maintenance in Drain.
func nodesOfDrains(w *world) []string {
	var out []string
	for _, nm := range w.maintenances {
		if w.stage(&nm) == v1alpha1.Drain {
			for _, n := range w.selected[nm.Name] {
				if !slices.Contains(out, n) {
					out = append(out, n)
				}
			}
		}
	}
	return out
}

// createEvacuation requests the evacuation of pod, with the evacuators the
// pod registered in its annotations.
func (r *Reconciler) createEvacuation(ctx context.Context, nm *v1alpha1.NodeMaintenance, p *corev1.Pod, node string) error {
	// The pod's labels, for selecting Evacuations as one selects pods,
	// but never ebb's own: a tenant's pod labelled
	// maintenance.ebb.dev/node=elsewhere would hide its Evacuation from
	// the maintenance that asked for it, which then adopted and released
	// it on every pass.
	labels := map[string]string{}
	for k, v := range p.Labels {
		if !strings.HasPrefix(k, v1alpha1.GroupVersion.Group+"/") {
			labels[k] = v
		}
	}
	labels[v1alpha1.EvacuationNodeLabel] = node
	e := &v1alpha1.Evacuation{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: p.Namespace, Name: v1alpha1.EvacuationName(p.UID, p.Name), Labels: labels,
			Annotations: map[string]string{v1alpha1.RequestedByAnnotation: nm.Name, v1alpha1.ReasonAnnotation: nm.Spec.Reason},
			Finalizers:  []string{v1alpha1.InstigatorFinalizer},
		},
		Spec: v1alpha1.EvacuationSpec{
			PodRef:                  v1alpha1.PodReference{Name: p.Name, UID: p.UID},
			ProgressDeadlineSeconds: v1alpha1.DefaultProgressDeadlineSeconds,
			Evacuators:              evacuator.Registered(p),
		},
	}
	if err := r.Client.Create(ctx, e); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the Evacuation of pod %s: %w", klog.KObj(p), err)
	}
	log.FromContext(ctx).Info("Requested evacuation", "pod", klog.KObj(p), "node", node)
	return nil
}

// forgetGoneEvacuations withdraws our finalizer from Evacuations whose pod
// is gone (or was replaced under the same name): nothing is left to do;
// and from those of pods on nodes no maintenance drains any more (the node
// left every selector), unless their evacuator forbids cancellation.
func (r *Reconciler) forgetGoneEvacuations(ctx context.Context, evacs []v1alpha1.Evacuation, draining []string) error {
	for i := range evacs {
		e := &evacs[i]
		if !controllerutil.ContainsFinalizer(e, v1alpha1.InstigatorFinalizer) {
			continue
		}
		if node := e.Labels[v1alpha1.EvacuationNodeLabel]; node != "" && !slices.Contains(draining, node) && e.Status.EvacuationCancellationPolicy != v1alpha1.CancellationForbid {
			if err := r.withdraw(ctx, e); err != nil {
				return err
			}
			continue
		}
		var p corev1.Pod
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: e.Namespace, Name: e.Spec.PodRef.Name}, &p)
		if err == nil && p.UID == e.Spec.PodRef.UID {
			continue
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("reading the pod of Evacuation %s: %w", klog.KObj(e), err)
		}
		if err := r.withdraw(ctx, e); err != nil {
			return err
		}
	}
	return nil
}

// withdraw removes our instigator finalizer from an Evacuation, and only
// that, as KEP-4212 has an instigator withdraw: the Evacuation controller
// deletes the Evacuation once no instigator is left. Deleting it here
// would cancel the requests of other instigators still on it (the
// Evacuation controller leaves a deleting Evacuation alone).
func (r *Reconciler) withdraw(ctx context.Context, e *v1alpha1.Evacuation) error {
	patch := client.MergeFrom(e.DeepCopy())
	controllerutil.RemoveFinalizer(e, v1alpha1.InstigatorFinalizer)
	if err := r.Client.Patch(ctx, e, patch); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("withdrawing from Evacuation %s: %w", klog.KObj(e), err)
	}
	return nil
}

// releaseEvacuations withdraws, on Complete, from the Evacuations of pods
// on this maintenance's nodes that no other maintenance in Drain covers,
// except those whose evacuator forbids cancellation.
func (r *Reconciler) releaseEvacuations(ctx context.Context, nm *v1alpha1.NodeMaintenance, w *world) error {
	var evacs v1alpha1.EvacuationList
	if err := r.Client.List(ctx, &evacs); err != nil {
		return fmt.Errorf("listing Evacuations: %w", err)
	}
	for i := range evacs.Items {
		e := &evacs.Items[i]
		node := e.Labels[v1alpha1.EvacuationNodeLabel]
		if !controllerutil.ContainsFinalizer(e, v1alpha1.InstigatorFinalizer) || !slices.Contains(w.selected[nm.Name], node) {
			continue
		}
		if len(w.covering(node, nm.Name, v1alpha1.Drain)) > 0 || e.Status.EvacuationCancellationPolicy == v1alpha1.CancellationForbid {
			continue
		}
		if err := r.withdraw(ctx, e); err != nil {
			return err
		}
	}
	return nil
}
