// Package surge is ebb's own evacuator for Deployment pods: instead of
// evicting the pod (downtime for a single replica, a drain blocked forever
// by a PodDisruptionBudget that protects it), it surges first. It marks
// the pod as the cheapest to delete, scales the Deployment up by one,
// waits until the new pod is Ready elsewhere, then scales back so that the
// ReplicaSet removes the marked pod. Any failure or cancellation restores
// the original replica count.
//
// Opt in with the annotation maintenance.ebb.dev/surge-evacuation: "true"
// on a Deployment (ebb then registers the evacuator on its pods) or with
// the evacuator annotation in the pod template.
package surge

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/kubectl/pkg/util/podutils"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/event"
)

// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=evacuations,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=evacuations/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apps,resources=deployments;replicasets,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=patch
// +kubebuilder:rbac:groups=autoscaling,resources=horizontalpodautoscalers,verbs=get;list;watch
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch

// Names of the surge evacuator (the others are in api/v1alpha1).
const (
	// DeletionCostAnnotation makes the ReplicaSet remove the marked pod
	// first when scaling down.
	DeletionCostAnnotation = "controller.kubernetes.io/pod-deletion-cost"
)

// Phases of a surge, in the lock annotation.
const (
	phaseSurging   = "surging"
	phaseReleasing = "releasing"
)

// recheck is how often a surge in progress is looked at.
const recheck = time.Second

// maxSurgeRetries bounds how often a surge starts again after its
// ReplicaSet removed another pod than the one leaving; then the next
// evacuator (or eviction) takes over.
const maxSurgeRetries = 3

// Evacuator moves opted-in Deployment pods by surging.
type Evacuator struct {
	Client   client.Client
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
}

// SetupClock defaults the clock to the real one.
func (s *Evacuator) SetupClock() {
	if s.Clock == nil {
		s.Clock = clock.RealClock{}
	}
}

// SetupWithManager registers the evacuator and the registrar.
func (s *Evacuator) SetupWithManager(mgr ctrl.Manager) error {
	s.SetupClock()
	// A Deployment's lock wakes its owner: a lock whose Evacuation went
	// while ebb was down is released when the Deployment is listed at start.
	err := ctrl.NewControllerManagedBy(mgr).Named("surge-evacuator").For(&v1alpha1.Evacuation{}).
		Watches(&appsv1.Deployment{}, handler.EnqueueRequestsFromMapFunc(lockOwner)).
		Complete(s)
	if err != nil {
		return err
	}
	// A Deployment opting in wakes its pods.
	podsOf := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		dep, ok := o.(*appsv1.Deployment)
		if !ok || dep.Annotations[v1alpha1.SurgeEvacuationAnnotation] == "" {
			return nil
		}
		pods, err := podsOf(ctx, mgr.GetClient(), dep)
		if err != nil {
			return nil
		}
		out := make([]reconcile.Request, 0, len(pods))
		for _, p := range pods {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&p)})
		}
		return out
	})
	return ctrl.NewControllerManagedBy(mgr).Named("surge-registrar").For(&corev1.Pod{}).
		Watches(&appsv1.Deployment{}, podsOf).
		Complete(&registrar{client: mgr.GetClient()})
}

// Reconcile moves one Evacuation's surge forward.
func (s *Evacuator) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	e := &v1alpha1.Evacuation{}
	err := s.Client.Get(ctx, req.NamespacedName, e)
	if apierrors.IsNotFound(err) {
		return ctrl.Result{}, s.releaseLocks(ctx, req.Namespace, req.Name)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	active := e.Status.ActiveEvacuatorClass == v1alpha1.SurgeEvacuatorClass && !e.Status.ActiveEvacuatorCompleted && e.DeletionTimestamp == nil
	if !active {
		// Handed on, completed, or cancelled: undo a surge of ours.
		return ctrl.Result{}, s.releaseLocks(ctx, e.Namespace, e.Name)
	}
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("evacuation", klog.KObj(e)))
	pod := &corev1.Pod{}
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: e.Namespace, Name: e.Spec.PodRef.Name}, pod); err != nil || pod.UID != e.Spec.PodRef.UID {
		return ctrl.Result{}, client.IgnoreNotFound(err) // gone: the Evacuation controller ends it
	}
	dep, why, err := s.deploymentOf(ctx, pod)
	if err != nil {
		return ctrl.Result{}, err
	}
	if dep == nil {
		return ctrl.Result{}, s.handOn(ctx, e, why)
	}
	return s.advance(ctx, e, pod, dep)
}

// deploymentOf finds the pod's Deployment; without one (or when an HPA
// owns its scale) it says why the surge does not apply.
func (s *Evacuator) deploymentOf(ctx context.Context, pod *corev1.Pod) (*appsv1.Deployment, string, error) {
	dep, why, err := owningDeployment(ctx, s.Client, pod)
	if dep == nil || err != nil {
		return nil, why, err
	}
	// Only the Deployment's owner opts in: an Evacuation can list the
	// surge evacuator because the pod carries its annotation, which
	// whoever may patch pods can add.
	if !optedIn(dep) {
		return nil, fmt.Sprintf("Deployment %s did not opt in (annotation %s: \"true\" on it, or %s in its pod template)",
			dep.Name, v1alpha1.SurgeEvacuationAnnotation, v1alpha1.EvacuatorAnnotationPrefix+v1alpha1.SurgeEvacuatorClass), nil
	}
	var hpas autoscalingv2.HorizontalPodAutoscalerList
	if err := s.Client.List(ctx, &hpas, client.InNamespace(pod.Namespace)); err != nil {
		return nil, "", fmt.Errorf("listing HorizontalPodAutoscalers: %w", err)
	}
	for _, h := range hpas.Items {
		if h.Spec.ScaleTargetRef.Kind == "Deployment" && h.Spec.ScaleTargetRef.Name == dep.Name {
			return nil, fmt.Sprintf("HorizontalPodAutoscaler %s owns the scale of Deployment %s", h.Name, dep.Name), nil
		}
	}
	return dep, "", nil
}

// advance runs one step of the surge.
func (s *Evacuator) advance(ctx context.Context, e *v1alpha1.Evacuation, pod *corev1.Pod, dep *appsv1.Deployment) (ctrl.Result, error) {
	owner, phase := lockOf(dep)
	switch {
	case owner != "" && owner != e.Name:
		return ctrl.Result{RequeueAfter: recheck}, s.report(ctx, e, fmt.Sprintf("Waiting: another pod of Deployment %s is being moved", dep.Name), false)
	case owner == "":
		return ctrl.Result{RequeueAfter: recheck}, s.start(ctx, e, pod, dep)
	case phase == phaseSurging:
		original, _ := strconv.Atoi(dep.Annotations[v1alpha1.SurgeOriginalReplicasAnnotation])
		if ptr.Deref(dep.Spec.Replicas, 1) != int32(original)+1 {
			return ctrl.Result{}, s.fail(ctx, e, dep, fmt.Sprintf("Deployment %s was scaled to %d during the surge", dep.Name, ptr.Deref(dep.Spec.Replicas, 1)))
		}
		peers, err := s.readyPeers(ctx, dep, pod)
		if err != nil {
			return ctrl.Result{}, err
		}
		if ready := len(peers); ready < original {
			return ctrl.Result{RequeueAfter: recheck}, s.report(ctx, e, fmt.Sprintf("Surged Deployment %s to %d replicas; waiting for a new pod to be Ready elsewhere (%d of %d other pods Ready)", dep.Name, original+1, ready, original), false)
		}
		if waiting, err := s.endpointsWaiting(ctx, pod, peers); err != nil || waiting != "" {
			if err == nil {
				err = s.report(ctx, e, "New pod Ready; waiting: "+waiting, false)
			}
			return ctrl.Result{RequeueAfter: recheck}, err
		}
		if blocked, err := s.budgetBlocks(ctx, pod); err != nil || blocked != "" {
			if err == nil {
				err = s.report(ctx, e, "New pod Ready; waiting: "+blocked, false)
			}
			return ctrl.Result{RequeueAfter: recheck}, err
		}
		// Marked only now, under our lock, right before the scale-down it
		// steers: a surge that fails or is cancelled earlier leaves no mark.
		if err := s.mark(ctx, pod); err != nil {
			return ctrl.Result{}, err
		}
		patch := client.MergeFromWithOptions(dep.DeepCopy(), client.MergeFromWithOptimisticLock{})
		dep.Spec.Replicas = ptr.To(int32(original))
		dep.Annotations[v1alpha1.SurgeLockAnnotation] = e.Name + "/" + phaseReleasing
		if err := s.Client.Patch(ctx, dep, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("scaling Deployment %s back to %d: %w", dep.Name, original, err)
		}
		log.FromContext(ctx).Info("New pod Ready; scaled back", "deployment", klog.KObj(dep), "replicas", original)
		return ctrl.Result{RequeueAfter: recheck}, s.report(ctx, e, fmt.Sprintf("New pod Ready; scaled Deployment %s back to %d so its ReplicaSet removes this pod", dep.Name, original), true)
	default: // releasing: the ReplicaSet removes the pod; its deletion ends the Evacuation
		original, _ := strconv.Atoi(dep.Annotations[v1alpha1.SurgeOriginalReplicasAnnotation])
		removed, err := s.removedInstead(ctx, dep, pod, original)
		if err != nil || removed == "" {
			return ctrl.Result{RequeueAfter: recheck}, err
		}
		retries, _ := strconv.Atoi(e.Annotations[v1alpha1.SurgeRetriesAnnotation])
		why := fmt.Sprintf("the ReplicaSet removed pod %s instead of this one (a pod that is not Ready goes first, whatever its deletion cost)", removed)
		if retries >= maxSurgeRetries {
			return ctrl.Result{}, s.fail(ctx, e, dep, fmt.Sprintf("%s, %d times", why, retries+1))
		}
		if err := s.restore(ctx, dep, e.Name); err != nil {
			return ctrl.Result{}, err
		}
		// Counted on the Evacuation: a surge that starts again reports
		// progress, so without a bound a pod whose readiness flaps would
		// keep the Evacuation from its progress deadline for ever.
		patch := client.MergeFrom(e.DeepCopy())
		if e.Annotations == nil {
			e.Annotations = map[string]string{}
		}
		e.Annotations[v1alpha1.SurgeRetriesAnnotation] = strconv.Itoa(retries + 1)
		if err := s.Client.Patch(ctx, e, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("counting the surges of Evacuation %s: %w", klog.KObj(e), err)
		}
		why += "; surging again"
		event.Publish(s.Recorder, surgeRetried(e, dep, why))
		return ctrl.Result{RequeueAfter: recheck}, s.report(ctx, e, "Surge released: "+why, false)
	}
}

// removedInstead names the pod the ReplicaSet removed at the scale-back
// when it was not pod ("" while pod is leaving, or the ReplicaSet has not
// acted yet): the Deployment is down to original pods that are not
// terminating, pod among them.
func (s *Evacuator) removedInstead(ctx context.Context, dep *appsv1.Deployment, pod *corev1.Pod, original int) (string, error) {
	if pod.DeletionTimestamp != nil {
		return "", nil
	}
	pods, err := podsOf(ctx, s.Client, dep)
	if err != nil {
		return "", err
	}
	staying, leaving := 0, ""
	for _, p := range pods {
		switch {
		case p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed:
			// Ended (evicted by the kubelet, say) and kept until collected:
			// not one the ReplicaSet counts.
		case p.DeletionTimestamp == nil:
			staying++
		case p.UID == pod.UID:
			return "", nil // leaving after all (listed after pod was read)
		default:
			leaving = p.Name
		}
	}
	if staying > original {
		return "", nil
	}
	if leaving == "" {
		leaving = "another pod" // already gone
	}
	return leaving, nil
}

// mark gives pod the lowest deletion cost, so that its ReplicaSet removes
// it, and not a peer, when the Deployment scales back.
func (s *Evacuator) mark(ctx context.Context, pod *corev1.Pod) error {
	if pod.Annotations[DeletionCostAnnotation] == strconv.Itoa(math.MinInt32) {
		return nil
	}
	patch := client.MergeFrom(pod.DeepCopy())
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[DeletionCostAnnotation] = strconv.Itoa(math.MinInt32)
	if err := s.Client.Patch(ctx, pod, patch); err != nil {
		return fmt.Errorf("marking pod %s as the cheapest to delete: %w", pod.Name, err)
	}
	return nil
}

// start records the replica count and surges by one.
func (s *Evacuator) start(ctx context.Context, e *v1alpha1.Evacuation, pod *corev1.Pod, dep *appsv1.Deployment) error {
	if blocked := dep.Spec.Paused; blocked {
		return s.handOn(ctx, e, fmt.Sprintf("Deployment %s is paused", dep.Name))
	}
	original := ptr.Deref(dep.Spec.Replicas, 1)
	patch := client.MergeFromWithOptions(dep.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if dep.Annotations == nil {
		dep.Annotations = map[string]string{}
	}
	dep.Annotations[v1alpha1.SurgeLockAnnotation] = e.Name + "/" + phaseSurging
	dep.Annotations[v1alpha1.SurgeOriginalReplicasAnnotation] = strconv.Itoa(int(original))
	dep.Spec.Replicas = ptr.To(original + 1)
	if err := s.Client.Patch(ctx, dep, patch); err != nil {
		return fmt.Errorf("surging Deployment %s to %d: %w", dep.Name, original+1, err)
	}
	e.Status.EvacuationCancellationPolicy = v1alpha1.CancellationAllow
	event.Publish(s.Recorder, surging(e, dep, pod, original))
	log.FromContext(ctx).Info("Surging", "deployment", klog.KObj(dep), "from", original)
	return s.report(ctx, e, fmt.Sprintf("Surged Deployment %s to %d replicas", dep.Name, original+1), true)
}

// readyPeers are the Deployment's Ready pods other than pod, by UID.
func (s *Evacuator) readyPeers(ctx context.Context, dep *appsv1.Deployment, pod *corev1.Pod) (map[types.UID]bool, error) {
	pods, err := podsOf(ctx, s.Client, dep)
	if err != nil {
		return nil, err
	}
	peers := map[types.UID]bool{}
	for _, p := range pods {
		if p.UID != pod.UID && p.DeletionTimestamp == nil && podutils.IsPodReady(&p) {
			peers[p.UID] = true
		}
	}
	return peers, nil
}

// budgetBlocks says which PodDisruptionBudget would not allow removing the
// pod now ("" if none).
func (s *Evacuator) budgetBlocks(ctx context.Context, pod *corev1.Pod) (string, error) {
	var pdbs policyv1.PodDisruptionBudgetList
	if err := s.Client.List(ctx, &pdbs, client.InNamespace(pod.Namespace)); err != nil {
		return "", fmt.Errorf("listing PodDisruptionBudgets: %w", err)
	}
	for _, b := range pdbs.Items {
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		if b.Status.ObservedGeneration < b.Generation || b.Status.DisruptionsAllowed < 1 {
			return fmt.Sprintf("PodDisruptionBudget %s allows %d disruptions (%d healthy, %d needed)", b.Name, b.Status.DisruptionsAllowed, b.Status.CurrentHealthy, b.Status.DesiredHealthy), nil
		}
	}
	return "", nil
}

// report records progress in the Evacuation status.
func (s *Evacuator) report(ctx context.Context, e *v1alpha1.Evacuation, msg string, progress bool) error {
	if e.Status.Message == msg && !progress {
		return nil
	}
	e.Status.Message = msg
	if progress || e.Status.EvacuationProgressTimestamp == nil {
		now := metav1.NewTime(s.Clock.Now())
		e.Status.EvacuationProgressTimestamp = &now
	}
	if err := s.Client.Status().Update(ctx, e); err != nil {
		return fmt.Errorf("reporting on Evacuation %s: %w", klog.KObj(e), err)
	}
	return nil
}

// handOn reports that the surge does not apply, so the next evacuator (or
// eviction) takes over.
func (s *Evacuator) handOn(ctx context.Context, e *v1alpha1.Evacuation, why string) error {
	e.Status.ActiveEvacuatorCompleted = true
	e.Status.Message = "Surge evacuation does not apply: " + why
	event.Publish(s.Recorder, surgeSkipped(e, why))
	if err := s.Client.Status().Update(ctx, e); err != nil {
		return fmt.Errorf("handing on Evacuation %s: %w", klog.KObj(e), err)
	}
	return nil
}

// fail restores the Deployment and hands on.
func (s *Evacuator) fail(ctx context.Context, e *v1alpha1.Evacuation, dep *appsv1.Deployment, why string) error {
	if err := s.restore(ctx, dep, e.Name); err != nil {
		return err
	}
	return s.handOn(ctx, e, why)
}

// releaseLocks undoes the surges this Evacuation holds in its namespace.
func (s *Evacuator) releaseLocks(ctx context.Context, ns, evacuation string) error {
	var deps appsv1.DeploymentList
	if err := s.Client.List(ctx, &deps, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("listing Deployments: %w", err)
	}
	for i := range deps.Items {
		if owner, _ := lockOf(&deps.Items[i]); owner == evacuation {
			if err := s.restore(ctx, &deps.Items[i], evacuation); err != nil {
				return err
			}
		}
	}
	return nil
}

// restore unmarks the pod (first, so that scaling down does not pick it),
// puts back the replica count of a surge still in its surging phase (a
// finished one already did), and removes the lock.
func (s *Evacuator) restore(ctx context.Context, dep *appsv1.Deployment, evacuation string) error {
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace(dep.Namespace)); err != nil {
		return err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp == nil && p.Annotations[DeletionCostAnnotation] == strconv.Itoa(math.MinInt32) && strings.HasPrefix(evacuation, string(p.UID)) {
			pp := client.MergeFrom(p.DeepCopy())
			delete(p.Annotations, DeletionCostAnnotation)
			if err := s.Client.Patch(ctx, p, pp); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("unmarking pod %s: %w", p.Name, err)
			}
		}
	}
	_, phase := lockOf(dep)
	patch := client.MergeFromWithOptions(dep.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if original, err := strconv.Atoi(dep.Annotations[v1alpha1.SurgeOriginalReplicasAnnotation]); err == nil && phase == phaseSurging && ptr.Deref(dep.Spec.Replicas, 1) == int32(original)+1 {
		dep.Spec.Replicas = ptr.To(int32(original))
	}
	delete(dep.Annotations, v1alpha1.SurgeLockAnnotation)
	delete(dep.Annotations, v1alpha1.SurgeOriginalReplicasAnnotation)
	if err := s.Client.Patch(ctx, dep, patch); err != nil {
		return fmt.Errorf("restoring Deployment %s: %w", dep.Name, err)
	}
	log.FromContext(ctx).Info("Surge released", "deployment", klog.KObj(dep), "phase", phase)
	return nil
}

// lockOwner maps a locked Deployment to the Evacuation holding its lock.
func lockOwner(_ context.Context, o client.Object) []reconcile.Request {
	dep, ok := o.(*appsv1.Deployment)
	if !ok {
		return nil
	}
	if owner, _ := lockOf(dep); owner != "" {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: dep.Namespace, Name: owner}}}
	}
	return nil
}

func lockOf(dep *appsv1.Deployment) (owner, phase string) {
	v := dep.Annotations[v1alpha1.SurgeLockAnnotation]
	i := strings.LastIndex(v, "/")
	if i < 0 {
		return v, ""
	}
	return v[:i], v[i+1:]
}

// registrar adds the surge evacuator's annotation to the pods of opted-in
// Deployments, so their Evacuations list it.
type registrar struct {
	client client.Client
}

func (r *registrar) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pod := &corev1.Pod{}
	if err := r.client.Get(ctx, req.NamespacedName, pod); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	key := v1alpha1.EvacuatorAnnotationPrefix + v1alpha1.SurgeEvacuatorClass
	if _, ok := pod.Annotations[key]; ok || pod.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	dep, _, err := owningDeployment(ctx, r.client, pod)
	if dep == nil || err != nil {
		return ctrl.Result{}, err
	}
	if !optedIn(dep) {
		return ctrl.Result{}, nil
	}
	patch := client.MergeFrom(pod.DeepCopy())
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[key] = v1alpha1.SurgeEvacuatorRegistration
	if err := r.client.Patch(ctx, pod, patch); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	return ctrl.Result{}, nil
}

// podsOf lists the pods a Deployment's selector selects.
func podsOf(ctx context.Context, c client.Client, dep *appsv1.Deployment) ([]corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("reading the selector of Deployment %s: %w", dep.Name, err)
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(dep.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("listing the pods of Deployment %s: %w", dep.Name, err)
	}
	return pods.Items, nil
}

// optedIn reports whether a Deployment asks for surge evacuation: on
// itself (the annotation) or in its pod template (the evacuator's
// registration, which its pods then carry).
func optedIn(dep *appsv1.Deployment) bool {
	if slices.Contains([]string{"true", "True"}, dep.Annotations[v1alpha1.SurgeEvacuationAnnotation]) {
		return true
	}
	_, ok := dep.Spec.Template.Annotations[v1alpha1.EvacuatorAnnotationPrefix+v1alpha1.SurgeEvacuatorClass]
	return ok
}

// owningDeployment walks from a pod to its ReplicaSet's Deployment; when
// there is none (or it is gone), it says why.
func owningDeployment(ctx context.Context, c client.Client, pod *corev1.Pod) (*appsv1.Deployment, string, error) {
	ref := metav1.GetControllerOf(pod)
	if ref == nil || ref.Kind != "ReplicaSet" {
		return nil, "the pod is not managed by a Deployment", nil
	}
	rs := &appsv1.ReplicaSet{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: ref.Name}, rs); err != nil {
		return nil, "the pod's ReplicaSet is gone", client.IgnoreNotFound(err)
	}
	dref := metav1.GetControllerOf(rs)
	if dref == nil || dref.Kind != "Deployment" {
		return nil, "the pod's ReplicaSet is not managed by a Deployment", nil
	}
	dep := &appsv1.Deployment{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: dref.Name}, dep); err != nil {
		return nil, "the pod's Deployment is gone", client.IgnoreNotFound(err)
	}
	return dep, "", nil
}
