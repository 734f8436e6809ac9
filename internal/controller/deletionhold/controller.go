// Package deletionhold holds a node's deletion by cluster-autoscaler until
// the load balancers have drained it. cluster-autoscaler, after it tainted
// a node ToBeDeletedByClusterAutoscaler and evicted its pods, waits before
// deleting the instance while any annotation with the prefix
// delay-deletion.cluster-autoscaler.kubernetes.io/ is on the node, up to
// its --node-deletion-delay-timeout (2 minutes by default), provided the
// annotation was there when it took the node (cluster-autoscaler's
// actuation.WaitForDelayDeletion). So ebb keeps its annotation on every
// node that may carry load-balancer traffic, and removes it from a leaving
// node only once every LoadBalancerReport shows the node Down with no
// connection left through it, or its own timeout passed.
package deletionhold

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbhost"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=loadbalancerreports,verbs=get;list;watch

const (
	// Annotation is ebb's hold: cluster-autoscaler reads every annotation
	// of the prefix delay-deletion.cluster-autoscaler.kubernetes.io/.
	Annotation = "delay-deletion.cluster-autoscaler.kubernetes.io/ebb"
	// annotationValue says to a person reading the node why it is there.
	annotationValue = "until-load-balancers-drained"
	// DefaultTimeout bounds a hold, as a NodeMaintenance's default
	// traffic-drain timeout does; cluster-autoscaler's own
	// --node-deletion-delay-timeout bounds it too.
	DefaultTimeout = 300 * time.Second
	// poll is how often a held leaving node's connections are looked at.
	poll = 2 * time.Second
	// unreportedGate is how long a hold waits for `ebb lb` pods that run
	// without a fresh report once every reporting replica has the node
	// Down with no connection: NodeMaintenance's drain waits as long
	// (nodemaintenance.lbGate). One pod that never reports (a replica
	// that cannot write its report, one starting on a new node) would
	// otherwise hold every leaving node to the timeout.
	unreportedGate = 30 * time.Second
)

// Node event reasons.
const (
	ReasonHeld         = "DeletionHeld"
	ReasonReleased     = "DeletionHoldReleased"
	ReasonHoldTimedOut = "DeletionHoldTimedOut"
)

// Reconciler keeps or releases the hold of each node.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Metrics  *Metrics
	Clock    clock.PassiveClock
	Model    lbmodel.Options
	// Enabled: hold nodes. When false, the reconciler only removes holds
	// left by an earlier configuration, so that turning the hold off
	// never leaves cluster-autoscaler waiting on ebb.
	Enabled bool
	// Timeout bounds a hold once the node is leaving (DefaultTimeout
	// when 0).
	Timeout time.Duration
	// LBNamespace is where ebb lb runs (lbhost.DefaultNamespace when
	// empty).
	LBNamespace string

	mu sync.Mutex
	// leavingSince is when each held node was first seen leaving: the
	// start of its timeout. In memory: after a restart the timeout starts
	// again, which only lengthens a hold that cluster-autoscaler bounds.
	leavingSince map[string]time.Time
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	return ctrl.NewControllerManagedBy(mgr).Named("deletion-hold").For(&corev1.Node{}).Complete(r)
}

// Reconcile adds the hold to a node in rotation and releases it from a
// leaving node whose traffic has drained.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, req.NamespacedName, node); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.Name) // deleted while held: nothing left to wait for
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	_, held := node.Annotations[Annotation]
	leaving, signal := r.leaving(node)
	switch {
	case !r.Enabled:
		if held {
			return ctrl.Result{}, r.setHold(ctx, node, false)
		}
		return ctrl.Result{}, nil
	case node.DeletionTimestamp != nil:
		r.forget(node.Name)
		return ctrl.Result{}, nil
	case !leaving:
		// In rotation: held. Excluded from load balancers (the label):
		// no traffic of ebb's to wait for.
		r.forget(node.Name)
		if want := lbmodel.EligibleNode(node); want != held {
			return ctrl.Result{}, r.setHold(ctx, node, want)
		}
		return ctrl.Result{}, nil
	case !held:
		// Released already, or the annotation removed by someone else:
		// nothing to wait for.
		r.forget(node.Name)
		return ctrl.Result{}, nil
	}
	return r.leavingHeld(ctx, node, signal)
}

// leavingHeld releases a held leaving node once no load balancer sends it
// anything, or once the timeout passed; until then it looks again every
// poll.
func (r *Reconciler) leavingHeld(ctx context.Context, node *corev1.Node, signal string) (ctrl.Result, error) {
	now := r.Clock.Now()
	since, first := r.start(node.Name, now)
	if first {
		event.Publish(r.Recorder, event.Event{Regarding: node, Type: corev1.EventTypeNormal, Reason: ReasonHeld, Action: "HoldDeletion",
			Note: fmt.Sprintf("The node is leaving (%s): ebb holds its deletion (annotation %s, which cluster-autoscaler waits for) until no load-balancer connection goes through it, at most %s", signal, Annotation, r.timeout())})
	}
	views, err := lbhost.ReadViews(ctx, r.Client, r.LBNamespace, metav1.NewTime(now))
	if err != nil {
		return ctrl.Result{}, err
	}
	v := views(node.Name)
	held := now.Sub(since)
	// The gate needs a replica that reports: with none, "Down, no
	// connection" is no one's word, and only the timeout releases.
	drained := v.Down && v.Connections == 0 && (len(v.Unknown) == 0 || (v.Reports > 0 && held >= unreportedGate))
	timedOut := held >= r.timeout()
	if !drained && !timedOut {
		return ctrl.Result{RequeueAfter: poll}, nil
	}
	if err := r.setHold(ctx, node, false); err != nil {
		return ctrl.Result{}, err
	}
	r.forget(node.Name)
	if drained {
		r.Metrics.releases.WithLabelValues("drained").Inc()
		event.Publish(r.Recorder, event.Event{Regarding: node, Type: corev1.EventTypeNormal, Reason: ReasonReleased, Action: "HoldDeletion",
			Note: fmt.Sprintf("No load-balancer connection goes through the node any more (after %s%s): cluster-autoscaler may delete it", held.Round(time.Second), unreportedNote(v))})
	} else {
		r.Metrics.releases.WithLabelValues("timeout").Inc()
		event.Publish(r.Recorder, event.Event{Regarding: node, Type: corev1.EventTypeWarning, Reason: ReasonHoldTimedOut, Action: "HoldDeletion",
			Note: fmt.Sprintf("Released the deletion hold after %s with %d load-balancer connection(s) still through the node%s: cluster-autoscaler may delete it", r.timeout(), v.Connections, unknownNote(v))})
	}
	log.FromContext(ctx).Info("Released a node's deletion hold", "node", klog.KObj(node), "drained", drained, "connections", v.Connections)
	return ctrl.Result{}, nil
}

// unreportedNote says which replicas a release did not hear from.
func unreportedNote(v lbhost.View) string {
	if len(v.Unknown) == 0 {
		return ""
	}
	return fmt.Sprintf("; ebb lb %v did not report for %s, and is not waited for longer", v.Unknown, unreportedGate)
}

func unknownNote(v lbhost.View) string {
	if len(v.Unknown) == 0 {
		return ""
	}
	return fmt.Sprintf(" (ebb lb %v did not report)", v.Unknown)
}

// setHold adds or removes ebb's annotation with a merge patch of that one
// key, which cannot undo another writer's change to the node.
func (r *Reconciler) setHold(ctx context.Context, node *corev1.Node, hold bool) error {
	value := "null"
	if hold {
		value = fmt.Sprintf("%q", annotationValue)
	}
	patch := client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, Annotation, value)))
	if err := r.Client.Patch(ctx, node, patch); err != nil {
		return fmt.Errorf("setting the deletion hold of %s to %v: %w", node.Name, hold, err)
	}
	return nil
}

// leaving is lbmodel.IsLeaving, except that cluster-autoscaler's taint
// always counts: the hold exists for it, and a node it takes that ebb did
// not count as leaving (--ignore-autoscaler-taint, or a list without it)
// would otherwise keep its hold until the autoscaler's own timeout.
func (r *Reconciler) leaving(node *corev1.Node) (bool, string) {
	if leaving, signal := lbmodel.IsLeaving(node, r.Model); leaving {
		return true, signal
	}
	for _, t := range node.Spec.Taints {
		if t.Key == lbmodel.TaintToBeDeleted {
			return true, t.Key
		}
	}
	return false, ""
}

func (r *Reconciler) timeout() time.Duration {
	if r.Timeout > 0 {
		return r.Timeout
	}
	return DefaultTimeout
}

// start returns when a held node was first seen leaving, and whether that
// is now.
func (r *Reconciler) start(node string, now time.Time) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leavingSince == nil {
		r.leavingSince = map[string]time.Time{}
	}
	if t, ok := r.leavingSince[node]; ok {
		return t, false
	}
	r.leavingSince[node] = now
	r.Metrics.waiting.Set(float64(len(r.leavingSince)))
	return now, true
}

func (r *Reconciler) forget(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.leavingSince, node)
	r.Metrics.waiting.Set(float64(len(r.leavingSince)))
}

// Metrics are the hold's Prometheus metrics.
type Metrics struct {
	releases *prometheus.CounterVec
	waiting  prometheus.Gauge
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ebb_deletion_hold_releases_total",
			Help: "Deletion holds released from leaving nodes, by reason: drained (no load-balancer connection left) or timeout.",
		}, []string{"reason"}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ebb_deletion_hold_leaving_nodes",
			Help: "Leaving nodes whose deletion ebb holds now, waiting for their load-balancer connections to end.",
		}),
	}
	for _, c := range []prometheus.Collector{m.releases, m.waiting} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering deletion hold metrics: %w", err)
		}
	}
	return m, nil
}
