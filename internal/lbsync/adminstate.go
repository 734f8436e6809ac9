package lbsync

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// adminStateSetter is the part of the data plane the fast path drives.
type adminStateSetter interface {
	SetOwnerAdminState(owner string, state dataplane.AdminState) (int, error)
}

// adminFastPath applies a node's admin state to the data plane the moment
// its taints change, from the Node informer, on a queue of its own: it does
// not wait for the whole configuration to be recomputed (which follows and
// agrees, since lbmodel derives both from the same taints). It keeps the
// state last wanted per node name, and does nothing when nothing changed.
// The name is the key the data plane knows backends by (their owner), and
// it is enough: the state always comes from the Node object just seen, so
// a replacement node with the same name (a new UID) that is not leaving
// differs from its predecessor's Down and is set None at once. A change
// that fails is retried with exponential backoff and reported once as a
// Node event.
type adminFastPath struct {
	dp       adminStateSetter
	model    lbmodel.Options
	recorder events.EventRecorder // nil: no events

	mu sync.Mutex
	// want is the state each node name's backends should carry, with when
	// that was observed and the node it was observed on.
	want map[string]wantedState
	// failed is the state whose failure was last reported per node name,
	// so a retrying failure makes one event, not one per attempt.
	failed map[string]dataplane.AdminState
	queue  workqueue.TypedRateLimitingInterface[string]

	adminMetrics
}

// wantedState is one node's desired admin state.
type wantedState struct {
	state    dataplane.AdminState
	observed time.Time
	node     *corev1.Node
}

func newAdminFastPath(dp adminStateSetter, model lbmodel.Options, recorder events.EventRecorder) *adminFastPath {
	return &adminFastPath{
		dp: dp, model: model, recorder: recorder,
		want:   map[string]wantedState{},
		failed: map[string]dataplane.AdminState{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "adminstate"}),
		adminMetrics: newAdminMetrics(),
	}
}

// observe is called with every added or updated node. It queues the node
// only when its state differs from what its backends should carry, so
// updates that change nothing cost nothing, and a replacement node (a new
// UID under the old name) gets its own state, not its predecessor's.
func (a *adminFastPath) observe(node *corev1.Node) {
	state := dataplane.AdminState(lbmodel.NodeAdminState(node, a.model))
	a.mu.Lock()
	last, ok := a.want[node.Name]
	if !ok {
		last.state = dataplane.AdminNone // backends start None
	}
	if state == last.state {
		last.node = node
		if ok {
			a.want[node.Name] = last
		}
		a.mu.Unlock()
		return
	}
	a.want[node.Name] = wantedState{state: state, observed: time.Now(), node: node}
	a.mu.Unlock()
	a.queue.Add(node.Name)
}

// forget lets go of a deleted node's object (its backends go with the next
// full sync). The state wanted for its name stays, a few bytes, so that a
// replacement under the same name is compared with what its backends carry.
func (a *adminFastPath) forget(node *corev1.Node) {
	a.mu.Lock()
	if w, ok := a.want[node.Name]; ok && w.node != nil && w.node.UID == node.UID {
		w.node = nil
		a.want[node.Name] = w
	}
	a.mu.Unlock()
}

// run applies queued changes until ctx is done.
func (a *adminFastPath) run(ctx context.Context, log logr.Logger) {
	go func() {
		<-ctx.Done()
		a.queue.ShutDown()
	}()
	for {
		name, shutdown := a.queue.Get()
		if shutdown {
			return
		}
		a.apply(log, name)
		a.queue.Done(name)
	}
}

// apply sets one node's backends to the state last wanted for it.
func (a *adminFastPath) apply(log logr.Logger, name string) {
	a.mu.Lock()
	w := a.want[name]
	a.mu.Unlock()
	n, err := a.dp.SetOwnerAdminState(name, w.state)
	if err != nil {
		a.errors.Inc()
		log.Error(err, "Setting a node's admin state; retrying", "node", klog.KRef("", name), "state", w.state)
		a.mu.Lock()
		first := a.failed[name] != w.state
		a.failed[name] = w.state
		a.mu.Unlock()
		if first && a.recorder != nil && w.node != nil {
			event.Publish(a.recorder, adminStateUpdateFailed(w.node, w.state, err))
		}
		a.queue.AddRateLimited(name)
		return
	}
	a.queue.Forget(name)
	a.mu.Lock()
	delete(a.failed, name)
	a.mu.Unlock()
	now := time.Now()
	a.latency.Observe(now.Sub(w.observed).Seconds())
	a.transitions.WithLabelValues(string(w.state)).Inc()
	a.appliedAt.WithLabelValues(name, string(w.state)).Set(float64(now.UnixNano()) / 1e9)
	log.Info("Applied a node's admin state", "node", klog.KRef("", name), "state", w.state, "backends", n, "latency", time.Since(w.observed))
}
