// Package evacuation is the Evacuation controller: it hands an Evacuation
// to its evacuators one after the other, highest priority first, moving
// on when the active one reports completion or makes no progress within
// the progress deadline, and, with none left, evicts the pod through the
// Eviction API (PodDisruptionBudgets respected). It never waits on a pod's
// termination inside a reconcile: pod events bring it back.
package evacuation

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/drainplan"
	"github.com/ebbdev/ebb/internal/event"
)

// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=evacuations,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=evacuations/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Phases reported by the metrics.
const (
	PhasePending    = "Pending"
	PhaseEvacuating = "Evacuating"
	PhaseEvicting   = "Evicting"
)

// Backoff of blocked evictions: doubled per failure, capped.
const (
	backoffBase = 2 * time.Second
	backoffMax  = 2 * time.Minute
)

// Reconciler reconciles Evacuations.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
	Metrics  *Metrics
	// MaxEvictionsInFlight bounds concurrent reconciles, hence evictions.
	MaxEvictionsInFlight int
}

// SetupWithManager registers the controller; a pod's changes wake its
// Evacuation (named after the pod's UID and name).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.MaxEvictionsInFlight <= 0 {
		r.MaxEvictionsInFlight = 5
	}
	r.Metrics.readFrom(mgr.GetClient())
	return ctrl.NewControllerManagedBy(mgr).
		Named("evacuation").
		For(&v1alpha1.Evacuation{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.evacuationOfPod)).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.MaxEvictionsInFlight}).
		Complete(r)
}

// evacuationOfPod maps a pod's event to its Evacuation, if it has one in
// the cache: most pods never have one, and waking a reconcile for each of
// their events made the work grow with the cluster's pod churn. An
// Evacuation created after the event is reconciled on its own creation,
// with the pod as the cache has it by then.
func (r *Reconciler) evacuationOfPod(ctx context.Context, o client.Object) []reconcile.Request {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return nil
	}
	key := client.ObjectKey{Namespace: p.Namespace, Name: v1alpha1.EvacuationName(p.UID, p.Name)}
	if err := r.Client.Get(ctx, key, &v1alpha1.Evacuation{}); apierrors.IsNotFound(err) {
		return nil
	}
	return []reconcile.Request{{NamespacedName: key}}
}

// Reconcile moves one Evacuation forward.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	e := &v1alpha1.Evacuation{}
	if err := r.Client.Get(ctx, req.NamespacedName, e); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	logger := log.FromContext(ctx).WithValues("evacuation", klog.KObj(e))
	ctx = log.IntoContext(ctx, logger)

	pod := &corev1.Pod{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: e.Namespace, Name: e.Spec.PodRef.Name}, pod)
	switch {
	case apierrors.IsNotFound(err) || err == nil && pod.UID != e.Spec.PodRef.UID:
		return ctrl.Result{}, r.finish(ctx, e, "the pod is gone")
	case err != nil:
		return ctrl.Result{}, fmt.Errorf("reading pod %s: %w", e.Spec.PodRef.Name, err)
	}

	// Every instigator withdrew: the request is cancelled when allowed.
	if !hasInstigator(e) && e.Status.EvacuationCancellationPolicy != v1alpha1.CancellationForbid {
		if e.DeletionTimestamp == nil {
			logger.Info("Every instigator withdrew: cancelling")
			return ctrl.Result{}, client.IgnoreNotFound(r.Client.Delete(ctx, e))
		}
		return ctrl.Result{}, nil
	}
	if e.DeletionTimestamp != nil && e.Status.EvacuationCancellationPolicy != v1alpha1.CancellationForbid {
		return ctrl.Result{}, nil // being cancelled
	}

	orig := e.DeepCopy()
	result, err := r.step(ctx, e, pod)
	if !equalStatus(orig, e) {
		if uerr := r.Client.Status().Update(ctx, e); uerr != nil {
			return ctrl.Result{}, errors.Join(err, fmt.Errorf("updating the status of %s: %w", klog.KObj(e), uerr))
		}
	}
	return result, err
}

// step decides what to do for a pod that still exists.
func (r *Reconciler) step(ctx context.Context, e *v1alpha1.Evacuation, pod *corev1.Pod) (ctrl.Result, error) {
	now := r.Clock.Now()
	if pod.DeletionTimestamp != nil {
		// A terminating pod's deletionTimestamp is when its grace period
		// runs out: the latest it can be gone. An evacuator's or our own
		// eviction's message says more than "terminating" and stays.
		if e.Status.ExpectedEvacuationFinishTime == nil {
			finish := *pod.DeletionTimestamp
			e.Status.ExpectedEvacuationFinishTime = &finish
			e.Status.Message = "The pod is terminating"
		}
		return ctrl.Result{}, nil
	}
	if drainplan.TypeOf(pod) == v1alpha1.Static {
		e.Status.Message = "A static pod cannot be evicted through the API: stop it on its node"
		return ctrl.Result{}, nil
	}
	if !meta.IsStatusConditionTrue(e.Status.Conditions, v1alpha1.EvictingCondition) {
		next, wait := r.handOff(ctx, e, now)
		if !next {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
	}
	// A refused eviction waits out its backoff: the refusal's own status
	// write and every pod update wake this controller long before that.
	if next := e.Status.NextEvictionTime; next != nil && now.Before(next.Time) {
		return ctrl.Result{RequeueAfter: next.Sub(now)}, nil
	}
	if drainplan.TypeOf(pod) == v1alpha1.DaemonSet {
		targeted, err := r.targetedByADrain(ctx, pod)
		if err != nil {
			return ctrl.Result{}, err
		}
		if !targeted {
			e.Status.Message = "A DaemonSet's pod is evicted only once the drain targets of a NodeMaintenance draining its node select it (KEP-4212), so that the node's daemons leave after the pods that need them"
			return ctrl.Result{RequeueAfter: daemonSetRecheck}, nil
		}
	}
	return r.evict(ctx, e, pod, now)
}

// daemonSetRecheck is how often a DaemonSet's pod that no drain targets yet
// is looked at again: a maintenance writes its targets in its status, which
// does not wake Evacuations.
const daemonSetRecheck = 5 * time.Second

// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=nodemaintenances,verbs=get;list;watch

// targetedByADrain reports whether a NodeMaintenance in Drain lists, for
// the pod's node, drain targets that select the pod: KEP-4212 has the
// DaemonSet side ignore Evacuations above the drain targets.
func (r *Reconciler) targetedByADrain(ctx context.Context, pod *corev1.Pod) (bool, error) {
	var list v1alpha1.NodeMaintenanceList
	if err := r.Client.List(ctx, &list); err != nil {
		return false, fmt.Errorf("listing NodeMaintenances: %w", err)
	}
	for _, nm := range list.Items {
		if nm.Spec.Stage != v1alpha1.Drain {
			continue
		}
		for _, ns := range nm.Status.NodeStatuses {
			if ns.NodeRef.Name == pod.Spec.NodeName && drainplan.Matches(ns.DrainTargets, pod) {
				return true, nil
			}
		}
	}
	return false, nil
}

// handOff keeps the active evacuator or moves to the next one; it returns
// true when no evacuator is left (evict), or how long until the active
// one's deadline.
func (r *Reconciler) handOff(ctx context.Context, e *v1alpha1.Evacuation, now time.Time) (bool, time.Duration) {
	deadline := time.Duration(e.Spec.ProgressDeadlineSeconds) * time.Second
	if deadline <= 0 {
		deadline = v1alpha1.DefaultProgressDeadlineSeconds * time.Second
	}
	st := &e.Status
	if st.ActiveEvacuatorClass != "" {
		last := st.EvacuationProgressTimestamp
		expired := last != nil && now.Sub(last.Time) >= deadline
		if !st.ActiveEvacuatorCompleted && !expired {
			wait := deadline
			if last != nil {
				wait = deadline - now.Sub(last.Time)
			}
			return false, wait
		}
		if expired && !st.ActiveEvacuatorCompleted {
			event.Publish(r.Recorder, evacuatorExpired(e, st.ActiveEvacuatorClass, deadline))
		}
	}
	next := nextEvacuator(e.Spec.Evacuators, st.ActiveEvacuatorClass)
	if next == "" {
		st.ActiveEvacuatorClass, st.ActiveEvacuatorCompleted = "", false
		return true, 0
	}
	ts := metav1.NewTime(now)
	st.ActiveEvacuatorClass, st.ActiveEvacuatorCompleted, st.EvacuationProgressTimestamp = next, false, &ts
	st.ExpectedEvacuationFinishTime = nil
	st.Message = fmt.Sprintf("Waiting for evacuator %s", next)
	event.Publish(r.Recorder, evacuatorSelected(e, next))
	log.FromContext(ctx).Info("Evacuator selected", "class", next)
	return false, deadline
}

// nextEvacuator is the evacuator after current by descending priority
// ("" when none is left); with current "", the first one.
func nextEvacuator(evacuators []v1alpha1.Evacuator, current string) string {
	sorted := slices.Clone(evacuators)
	slices.SortStableFunc(sorted, func(a, b v1alpha1.Evacuator) int { return cmp.Compare(b.Priority, a.Priority) })
	i := 0
	if current != "" {
		i = slices.IndexFunc(sorted, func(ev v1alpha1.Evacuator) bool { return ev.EvacuatorClass == current }) + 1
		if i == 0 {
			return "" // the active one is no longer listed: fall back
		}
	}
	if i >= len(sorted) {
		return ""
	}
	return sorted[i].EvacuatorClass
}

// evict asks the Eviction API to remove the pod, with a UID precondition.
func (r *Reconciler) evict(ctx context.Context, e *v1alpha1.Evacuation, pod *corev1.Pod, now time.Time) (ctrl.Result, error) {
	reason := "NoEvacuator"
	if len(e.Spec.Evacuators) > 0 {
		reason = "EvacuatorsExhausted"
	}
	meta.SetStatusCondition(&e.Status.Conditions, metav1.Condition{Type: v1alpha1.EvictingCondition, Status: metav1.ConditionTrue, Reason: reason,
		Message: "evicting the pod through the Eviction API", ObservedGeneration: e.Generation})
	uid := pod.UID
	eviction := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
	}
	err := r.Client.SubResource("eviction").Create(ctx, pod, eviction)
	e.Status.NextEvictionTime = nil
	switch {
	case err == nil:
		r.Metrics.evictions.WithLabelValues("evicted").Inc()
		// As an evacuator would (KEP-4212's examples): when the pod should
		// be gone, and why it goes.
		grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
		if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
			grace = *g
		}
		progress, finish := metav1.NewTime(now), metav1.NewTime(now.Add(time.Duration(grace)*time.Second))
		e.Status.EvacuationProgressTimestamp, e.Status.ExpectedEvacuationFinishTime = &progress, &finish
		e.Status.Message = evictedMessage(e)
		event.Publish(r.Recorder, evicted(e, pod))
		return ctrl.Result{}, nil
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err) && r.replaced(ctx, pod):
		// Gone, or replaced (the UID precondition failed): done.
		r.Metrics.evictions.WithLabelValues("gone").Inc()
		return ctrl.Result{}, nil
	case apierrors.IsConflict(err):
		// The pod is still there: the API server gives up on repeated
		// write conflicts on its PodDisruptionBudget with a 409. Nothing
		// else would wake this Evacuation, so back off and try again, as
		// for a refusal.
		r.Metrics.evictions.WithLabelValues("conflict").Inc()
		e.Status.FailedEvictionCounter++
		e.Status.Message = "Eviction conflicted, trying again: " + err.Error()
		wait := backoff(e.Status.FailedEvictionCounter)
		next := metav1.NewTime(now.Add(wait))
		e.Status.NextEvictionTime = &next
		return ctrl.Result{RequeueAfter: wait}, nil
	case apierrors.IsTooManyRequests(err):
		r.Metrics.evictions.WithLabelValues("blocked").Inc()
		e.Status.FailedEvictionCounter++
		e.Status.Message = blockedMessage(err)
		event.Publish(r.Recorder, evictionBlocked(e, pod))
		wait := backoff(e.Status.FailedEvictionCounter)
		next := metav1.NewTime(now.Add(wait))
		e.Status.NextEvictionTime = &next
		return ctrl.Result{RequeueAfter: wait}, nil
	default:
		r.Metrics.evictions.WithLabelValues("error").Inc()
		e.Status.Message = fmt.Sprintf("Eviction failed: %v", err)
		return ctrl.Result{}, fmt.Errorf("evicting pod %s: %w", klog.KObj(pod), err)
	}
}

// replaced reports whether pod is gone or another pod has its name now,
// as the Eviction API's UID precondition says with a 409. An error
// reading it counts as not replaced: the eviction is tried again.
func (r *Reconciler) replaced(ctx context.Context, pod *corev1.Pod) bool {
	now := &corev1.Pod{}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(pod), now)
	return apierrors.IsNotFound(err) || err == nil && now.UID != pod.UID
}

// evictedMessage says that the pod is terminating and, for an Evacuation a
// node maintenance asked for, which one and why, in the words of
// KEP-4212's examples ("... is terminating the pod due to node maintenance
// (OS upgrade).").
func evictedMessage(e *v1alpha1.Evacuation) string {
	by, reason := e.Annotations[v1alpha1.RequestedByAnnotation], e.Annotations[v1alpha1.ReasonAnnotation]
	switch {
	case by != "" && reason != "":
		return fmt.Sprintf("The Eviction API is terminating the pod due to node maintenance %s (%s).", by, reason)
	case by != "":
		return fmt.Sprintf("The Eviction API is terminating the pod due to node maintenance %s.", by)
	default:
		return "The Eviction API is terminating the pod."
	}
}

// blockedMessage names the PodDisruptionBudget and why it refused.
func blockedMessage(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Details != nil {
		for _, c := range status.Status().Details.Causes {
			if c.Type == policyv1.DisruptionBudgetCause && c.Message != "" {
				return "Eviction blocked: " + c.Message
			}
		}
	}
	return "Eviction blocked: " + err.Error()
}

// backoff is the wait after the given number of refused evictions: 2 s
// doubling to 2 min. Computed from status.failedEvictionCounter and kept
// as status.nextEvictionTime, not a workqueue rate limiter, so that it
// survives a controller restart and a new leader.
func backoff(failures int32) time.Duration {
	d := backoffBase
	for i := int32(1); i < failures && d < backoffMax; i++ {
		d *= 2
	}
	return min(d, backoffMax)
}

// finish ends an Evacuation whose pod is gone: the instigators' finalizers
// are fulfilled, so they are removed with the object.
func (r *Reconciler) finish(ctx context.Context, e *v1alpha1.Evacuation, why string) error {
	var kept []string
	for _, f := range e.Finalizers {
		if !strings.HasPrefix(f, v1alpha1.InstigatorFinalizerPrefix) {
			kept = append(kept, f)
		}
	}
	if len(kept) != len(e.Finalizers) {
		patch := client.MergeFrom(e.DeepCopy())
		e.Finalizers = kept
		if err := r.Client.Patch(ctx, e, patch); err != nil {
			return client.IgnoreNotFound(err)
		}
	}
	if e.DeletionTimestamp == nil {
		if err := r.Client.Delete(ctx, e); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting Evacuation %s: %w", klog.KObj(e), err)
		}
	}
	log.FromContext(ctx).Info("Evacuation finished", "why", why)
	return nil
}

func hasInstigator(e *v1alpha1.Evacuation) bool {
	return slices.ContainsFunc(e.Finalizers, func(f string) bool { return strings.HasPrefix(f, v1alpha1.InstigatorFinalizerPrefix) })
}

func equalStatus(a, b *v1alpha1.Evacuation) bool {
	return apiequality.Semantic.DeepEqual(a.Status, b.Status)
}

// Phase is an Evacuation's phase for people and metrics.
func Phase(e *v1alpha1.Evacuation) string {
	switch {
	case meta.IsStatusConditionTrue(e.Status.Conditions, v1alpha1.EvictingCondition):
		return PhaseEvicting
	case e.Status.ActiveEvacuatorClass != "":
		return PhaseEvacuating
	default:
		return PhasePending
	}
}
