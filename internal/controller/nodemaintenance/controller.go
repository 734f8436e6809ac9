// Package nodemaintenance is the NodeMaintenance controller (KEP-4212):
// it cordons the selected nodes, taints them draining (which turns their
// load-balancer backends Down), creates Evacuations for their pods in the
// order of the drain plans of every maintenance on them, reports progress
// in the status and on the nodes, and undoes its own changes on Complete.
package nodemaintenance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/drainplan"
	"github.com/ebbdev/ebb/internal/event"
)

// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=nodemaintenances,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=nodemaintenances/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=evacuations,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=nodes/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// podNodeIndex indexes pods by spec.nodeName.
const podNodeIndex = "spec.nodeName"

// drainResync re-checks a maintenance in Drain this often, in case a
// change was missed.
const drainResync = 30 * time.Second

// Reconciler reconciles NodeMaintenances.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
	Metrics  *Metrics
	// MaxDrainingNodes limits how many nodes drain at once across
	// maintenances (0: no limit); see slots.go.
	MaxDrainingNodes int
	// LBNamespace is where ebb lb's DaemonSet runs (lbhost.ListPods:
	// lbhost.DefaultNamespace when empty).
	LBNamespace string
}

// SetupWithManager registers the controller, its pod index and watches
// (which event wakes which maintenance: see wakeups.go).
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.Pod{}, podNodeIndex, func(o client.Object) []string {
		if p, ok := o.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			return []string{p.Spec.NodeName}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("indexing pods by node: %w", err)
	}
	active := []v1alpha1.NodeMaintenanceStage{v1alpha1.Cordon, v1alpha1.Drain}
	draining := []v1alpha1.NodeMaintenanceStage{v1alpha1.Drain}
	wake := func(f handler.MapFunc) handler.EventHandler { return handler.EnqueueRequestsFromMapFunc(f) }
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodemaintenance").
		For(&v1alpha1.NodeMaintenance{}).
		Watches(&v1alpha1.NodeMaintenance{}, wake(r.maintenancesIn(active...))).
		Watches(&corev1.Node{}, wake(r.maintenancesOf(nodeOfNode, true, active...))).
		Watches(&corev1.Pod{}, wake(r.maintenancesOf(nodeOfPod, false, draining...))).
		Watches(&v1alpha1.Evacuation{}, wake(r.maintenancesOf(r.nodeOfEvacuation, false, draining...))).
		Watches(&v1alpha1.LoadBalancerReport{}, wake(r.maintenancesIn(draining...))).
		Complete(r)
}

// world is what one reconcile reads from the caches.
type world struct {
	maintenances []v1alpha1.NodeMaintenance
	nodes        []corev1.Node
	// selected are each maintenance's nodes, sorted by name.
	selected map[string][]string
	// waiting are the maintenances in Drain that wait for a drain slot,
	// with why (see slots.go): until they start, they only cordon.
	waiting map[string]string
}

// stage is what nm does now: a maintenance waiting for a drain slot
// cordons and nothing more.
func (w *world) stage(nm *v1alpha1.NodeMaintenance) v1alpha1.NodeMaintenanceStage {
	if _, ok := w.waiting[nm.Name]; ok {
		return v1alpha1.Cordon
	}
	return nm.Spec.Stage
}

// covering returns the maintenances other than self in one of stages that
// select node.
func (w *world) covering(node, self string, stages ...v1alpha1.NodeMaintenanceStage) []string {
	var out []string
	for _, nm := range w.maintenances {
		if nm.Name != self && slices.Contains(stages, w.stage(&nm)) && slices.Contains(w.selected[nm.Name], node) {
			out = append(out, nm.Name)
		}
	}
	// The cache lists in no fixed order; these names go into node
	// condition messages, which must not change while nothing else does.
	slices.Sort(out)
	return out
}

func (w *world) node(name string) *corev1.Node {
	for i := range w.nodes {
		if w.nodes[i].Name == name {
			return &w.nodes[i]
		}
	}
	return nil
}

func (r *Reconciler) read(ctx context.Context) (*world, error) {
	w := &world{selected: map[string][]string{}}
	var nms v1alpha1.NodeMaintenanceList
	if err := r.Client.List(ctx, &nms); err != nil {
		return nil, fmt.Errorf("listing NodeMaintenances: %w", err)
	}
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	w.maintenances, w.nodes = nms.Items, nodes.Items
	for _, nm := range w.maintenances {
		sel, err := nodeaffinity.NewNodeSelector(nm.Spec.NodeSelector)
		if err != nil {
			continue // admission rejects these; an old object selects nothing
		}
		for i := range w.nodes {
			if sel.Match(&w.nodes[i]) {
				w.selected[nm.Name] = append(w.selected[nm.Name], w.nodes[i].Name)
			}
		}
		sort.Strings(w.selected[nm.Name])
	}
	w.waiting = drainSlots(w, r.MaxDrainingNodes)
	return w, nil
}

// Reconcile moves one maintenance towards its stage.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	nm := &v1alpha1.NodeMaintenance{}
	if err := r.Client.Get(ctx, req.NamespacedName, nm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	logger := log.FromContext(ctx).WithValues("nodemaintenance", klog.KObj(nm))
	ctx = log.IntoContext(ctx, logger)

	// Deletion moves a maintenance that left Idle to Complete first.
	if nm.DeletionTimestamp != nil {
		if !controllerutil.ContainsFinalizer(nm, v1alpha1.MaintenanceCompletionFinalizer) {
			return ctrl.Result{}, nil
		}
		if nm.Spec.Stage != v1alpha1.Complete && nm.Spec.Stage != v1alpha1.Idle {
			nm.Spec.Stage = v1alpha1.Complete
			if err := r.Client.Update(ctx, nm); err != nil {
				return ctrl.Result{}, fmt.Errorf("moving %s to Complete on deletion: %w", nm.Name, err)
			}
			logger.Info("Deleted: moving to Complete first")
			return ctrl.Result{}, nil
		}
	} else if nm.Spec.Stage != v1alpha1.Idle && !controllerutil.ContainsFinalizer(nm, v1alpha1.MaintenanceCompletionFinalizer) {
		controllerutil.AddFinalizer(nm, v1alpha1.MaintenanceCompletionFinalizer)
		if err := r.Client.Update(ctx, nm); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding the completion finalizer to %s: %w", nm.Name, err)
		}
		return ctrl.Result{}, nil
	}
	if nm.DeletionTimestamp == nil && len(nm.Spec.DrainPlan) == 0 {
		return ctrl.Result{}, r.defaultDrainPlan(ctx, nm)
	}

	w, err := r.read(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	r.Metrics.observeStages(w.maintenances)
	// Read before updateStatus forgets them.
	left := leftNodes(nm, w)
	phase, drain, result, err := r.act(ctx, nm, w, left)
	if err != nil {
		// A failing step shows in the status, not only in the log.
		return ctrl.Result{}, errors.Join(err, r.reportFailure(ctx, nm, phase, err))
	}
	if err := r.updateStatus(ctx, nm, w, drain); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.publishNodeConditions(ctx, w, drain, nm, left); err != nil {
		return ctrl.Result{}, err
	}
	if nm.DeletionTimestamp != nil && (nm.Spec.Stage == v1alpha1.Complete || nm.Spec.Stage == v1alpha1.Idle) {
		controllerutil.RemoveFinalizer(nm, v1alpha1.MaintenanceCompletionFinalizer)
		if err := r.Client.Update(ctx, nm); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, fmt.Errorf("removing the completion finalizer from %s: %w", nm.Name, err)
		}
		r.Metrics.forget(nm.Name)
		logger.Info("Completed and released")
	}
	return result, nil
}

// act does what nm's stage asks of its nodes and pods; on failure it
// names the step that failed (Cordon, Taint, Drain, Complete, Release).
func (r *Reconciler) act(ctx context.Context, nm *v1alpha1.NodeMaintenance, w *world, left []string) (string, *drainResult, ctrl.Result, error) {
	var result ctrl.Result
	var drain *drainResult
	switch w.stage(nm) {
	case v1alpha1.Cordon:
		if err := r.cordon(ctx, nm, w); err != nil {
			return "Cordon", nil, result, err
		}
	case v1alpha1.Drain:
		if err := r.cordon(ctx, nm, w); err != nil {
			return "Cordon", nil, result, err
		}
		if err := r.taint(ctx, nm, w); err != nil {
			return "Taint", nil, result, err
		}
		var err error
		if drain, err = r.drain(ctx, nm, w); err != nil {
			return "Drain", nil, result, err
		}
		result.RequeueAfter = drain.requeueAfter()
	case v1alpha1.Complete:
		if err := r.complete(ctx, nm, w); err != nil {
			return "Complete", nil, result, err
		}
	}
	if _, ok := w.waiting[nm.Name]; ok {
		result.RequeueAfter = drainResync
	}
	if nm.Spec.Stage != v1alpha1.Idle {
		if err := r.releaseNodes(ctx, nm, w, left); err != nil {
			return "Release", nil, result, err
		}
	}
	return "", drain, result, nil
}

// reportFailure records in the maintenance's Reconciled condition that a
// step failed, and why; written only when that changes, so a failure that
// repeats on every retry writes once.
func (r *Reconciler) reportFailure(ctx context.Context, nm *v1alpha1.NodeMaintenance, phase string, cause error) error {
	latest := &v1alpha1.NodeMaintenance{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(nm), latest); err != nil {
		return client.IgnoreNotFound(err)
	}
	changed := meta.SetStatusCondition(&latest.Status.Conditions, metav1.Condition{Type: v1alpha1.ReconciledCondition, Status: metav1.ConditionFalse,
		Reason: phase + "Failed", Message: cause.Error(), ObservedGeneration: latest.Generation})
	if !changed {
		return nil
	}
	if err := r.Client.Status().Update(ctx, latest); err != nil {
		return fmt.Errorf("recording the failure of %s in the status of %s: %w", phase, nm.Name, err)
	}
	return nil
}

// defaultDrainPlan gives a maintenance that has no drain plan the default
// one, as admission would have: without the webhook (or with it failing
// open) such a maintenance would cordon and taint and never evacuate. The
// plan is immutable once set, and set only this once.
func (r *Reconciler) defaultDrainPlan(ctx context.Context, nm *v1alpha1.NodeMaintenance) error {
	nm.Spec.DrainPlan = drainplan.Defaults()
	if err := r.Client.Update(ctx, nm); err != nil {
		return fmt.Errorf("setting the default drain plan of %s: %w", nm.Name, err)
	}
	event.Publish(r.Recorder, drainPlanDefaulted(nm))
	log.FromContext(ctx).Info("Drain plan defaulted")
	return nil
}

// drainStates builds the resolution input of every maintenance in Drain.
func drainStates(w *world) []*drainState {
	var out []*drainState
	for _, nm := range w.maintenances {
		if w.stage(&nm) != v1alpha1.Drain || len(nm.Spec.DrainPlan) == 0 {
			continue
		}
		// A plan stored without the defaults (created while the webhook
		// was off) drains as admission would have defaulted it; a
		// defaulted plan is unchanged by this.
		plan := drainplan.WithDefaults(nm.Spec.DrainPlan)
		s := &drainState{
			Name: nm.Name, Created: nm.CreationTimestamp.Time, Plan: plan,
			Index: min(int(nm.Status.DrainPlanIndex), len(plan)-1), Nodes: w.selected[nm.Name],
			Recorded: map[string][]v1alpha1.DrainPlanEntry{}, Behind: map[string]int{},
		}
		for _, ns := range nm.Status.NodeStatuses {
			if len(ns.DrainTargets) > 0 {
				s.Recorded[ns.NodeRef.Name] = ns.DrainTargets
			}
			if ns.DrainPlanIndex != nil && int(*ns.DrainPlanIndex) < s.Index {
				s.Behind[ns.NodeRef.Name] = int(*ns.DrainPlanIndex)
			}
		}
		// A node the drain never targeted joined late: it starts at the
		// first entry. (A node of a status written before ebb recorded
		// each node's entry has targets, and is at the maintenance's.)
		for _, node := range s.Nodes {
			if _, targeted := s.Recorded[node]; !targeted && s.Index > 0 {
				s.Behind[node] = 0
			}
		}
		out = append(out, s)
	}
	return out
}

// static reports whether a pod is a static pod's mirror: it cannot be
// evacuated through the API.
func static(p *corev1.Pod) bool { return drainplan.TypeOf(p) == v1alpha1.Static }
