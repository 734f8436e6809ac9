package lbsync

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// adminFastPath applies a node's admin state to the data plane the moment
// its taints change, from the Node informer, on a queue of its own: it does
// not wait for the whole configuration to be recomputed (which follows and
// agrees, since lbmodel derives both from the same taints). It keeps the
// last state per node UID, so that a replacement node with the same name
// does not inherit Down, and does nothing when nothing changed.
type adminFastPath struct {
	dp    *dataplane.DataPlane
	model lbmodel.Options

	mu sync.Mutex
	// states is the draining set: each node's state by UID.
	states map[types.UID]dataplane.AdminState
	// applied is the last state queued for each node name, which is what
	// the data plane's backends of that name carry.
	applied map[string]dataplane.AdminState
	queue   chan adminChange

	transitions *prometheus.CounterVec
	errors      prometheus.Counter
	latency     prometheus.Histogram
}

// adminChange is one node's new admin state, and when it was observed.
type adminChange struct {
	node     string
	state    dataplane.AdminState
	observed time.Time
}

func newAdminFastPath(dp *dataplane.DataPlane, model lbmodel.Options) *adminFastPath {
	return &adminFastPath{
		dp: dp, model: model,
		states:  map[types.UID]dataplane.AdminState{},
		applied: map[string]dataplane.AdminState{},
		queue:   make(chan adminChange, 1024),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ebb_lb_admin_state_transitions_total",
			Help: "Admin state changes applied to a node's backends by the fast path; state is Down or None.",
		}, []string{"state"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ebb_lb_admin_state_errors_total",
			Help: "Admin state changes the fast path could not apply.",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ebb_lb_admin_state_apply_seconds",
			Help:    "Time from a node's taint change being observed to its backends' admin state being applied.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10),
		}),
	}
}

func (a *adminFastPath) collectors() []prometheus.Collector {
	return []prometheus.Collector{a.transitions, a.errors, a.latency}
}

// observe is called with every added or updated node. It queues a change
// only when the node's state differs from what its backends carry, so
// updates that change nothing cost nothing, and a replacement node (a new
// UID under the old name) gets its own state, not its predecessor's.
func (a *adminFastPath) observe(node *corev1.Node) {
	state := lbmodel.AdminState(node, a.model)
	a.mu.Lock()
	a.states[node.UID] = state
	last, ok := a.applied[node.Name]
	if !ok {
		last = dataplane.AdminNone // backends start None
	}
	if state == last {
		a.mu.Unlock()
		return
	}
	a.applied[node.Name] = state
	a.mu.Unlock()
	a.queue <- adminChange{node: node.Name, state: state, observed: time.Now()}
}

// forget drops a deleted node from the draining set; its backends go with
// the next full sync.
func (a *adminFastPath) forget(node *corev1.Node) {
	a.mu.Lock()
	delete(a.states, node.UID)
	a.mu.Unlock()
}

// run applies queued changes in order until ctx is done.
func (a *adminFastPath) run(ctx context.Context, log logr.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case ch := <-a.queue:
			n, err := a.dp.SetOwnerAdminState(ch.node, ch.state)
			if err != nil {
				a.errors.Inc()
				log.Error(err, "Setting a node's admin state", "node", klog.KRef("", ch.node), "state", ch.state)
				continue
			}
			a.latency.Observe(time.Since(ch.observed).Seconds())
			a.transitions.WithLabelValues(string(ch.state)).Inc()
			log.Info("Applied a node's admin state", "node", klog.KRef("", ch.node), "state", ch.state, "backends", n, "latency", time.Since(ch.observed))
		}
	}
}
