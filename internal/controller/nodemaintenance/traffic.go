package nodemaintenance

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/event"
)

// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=loadbalancerreports,verbs=get;list;watch

// DefaultTrafficDrainTimeout bounds the wait for connections through a
// drained node when the maintenance does not say.
const DefaultTrafficDrainTimeout = 300 * time.Second

// lbGate is how long a drain waits for the load balancers to report a node
// Down before evacuating anyway (a replica that cannot report must not
// hold a maintenance forever).
const lbGate = 30 * time.Second

// lbView is what the fresh LoadBalancerReports say about one node.
type lbView struct {
	// down: every replica that has backends on the node applies Down.
	down bool
	// connections still established through the node, over replicas.
	connections int64
}

// loadBalancerViews reads the reports of the `ebb lb` replicas; stale ones
// (a replica that is gone) are ignored. A node no replica lists has no
// backends: it is Down with no connection.
func (r *Reconciler) loadBalancerViews(ctx context.Context) (func(node string) lbView, error) {
	var list v1alpha1.LoadBalancerReportList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing LoadBalancerReports: %w", err)
	}
	now := metav1.NewTime(r.Clock.Now())
	views := map[string]lbView{}
	for i := range list.Items {
		rep := &list.Items[i]
		if !rep.Fresh(now) {
			continue
		}
		for _, n := range rep.Status.Nodes {
			v, seen := views[n.Name]
			if !seen {
				v.down = true
			}
			v.down = v.down && n.AdminState == v1alpha1.AdminStateDown
			v.connections += n.Connections
			views[n.Name] = v
		}
	}
	return func(node string) lbView {
		if v, ok := views[node]; ok {
			return v
		}
		return lbView{down: true}
	}, nil
}

// trafficDrain decides, for one node, whether evacuation may start (the
// load balancers stopped sending it new connections, or lbGate passed
// since the Drain stage started) and whether its traffic is drained (no
// established connection left, or the maintenance's traffic-drain timeout
// passed since the load balancers went Down).
func (r *Reconciler) trafficDrain(nm *v1alpha1.NodeMaintenance, node string, view lbView, nd *nodeDrain) {
	now := r.Clock.Now()
	nd.lbDown, nd.connections = view.down, view.connections
	if old := oldNodeStatus(nm, node); old != nil && old.TrafficDrainStartTime != nil {
		nd.trafficStart = old.TrafficDrainStartTime
	} else if view.down {
		// The status keeps whole seconds: round up, so that the wait is
		// never shorter than the timeout.
		t := metav1.NewTime(now.Truncate(time.Second).Add(time.Second))
		nd.trafficStart = &t
	}
	nd.mayEvacuate = view.down
	if !view.down {
		if started := drainStarted(nm); started != nil && now.Sub(started.Time) >= lbGate {
			// Given up on the load balancers: do not wait on their traffic.
			nd.mayEvacuate, nd.lbGateExpired, nd.trafficDone = true, true, true
		}
		return
	}
	timeout := DefaultTrafficDrainTimeout
	if nm.Spec.TrafficDrainTimeoutSeconds != nil {
		timeout = time.Duration(*nm.Spec.TrafficDrainTimeoutSeconds) * time.Second
	}
	deadline := nd.trafficStart.Add(timeout)
	left := deadline.Sub(now)
	switch {
	case view.connections == 0:
		nd.trafficDone = true
	case left <= 0:
		nd.trafficDone, nd.trafficTimedOut = true, true
	default:
		nd.trafficLeft, nd.trafficDeadline = left, deadline
	}
}

// drainStarted is when the maintenance's Drain stage started.
func drainStarted(nm *v1alpha1.NodeMaintenance) *metav1.Time {
	for _, s := range nm.Status.StageStatuses {
		if s.Name == v1alpha1.Drain {
			return s.StartTimestamp
		}
	}
	return nil
}

// timedOutText marks a node drained by the traffic-drain timeout.
const timedOutText = "traffic-drain timeout passed"

// trafficMessage explains a node whose pods are handled but whose traffic
// is not ("" when there is nothing to add).
func trafficMessage(nd *nodeDrain) string {
	switch {
	case !nd.lbDown && !nd.lbGateExpired:
		return "Waiting for the load balancers to stop sending new connections to the node"
	case !nd.trafficDone:
		// The deadline, not a countdown: a countdown would rewrite the
		// status on every reconcile.
		return fmt.Sprintf("Waiting for %d established connection(s) through the load balancers to finish (traffic-drain timeout at %s)",
			nd.connections, nd.trafficDeadline.UTC().Format(time.RFC3339))
	case nd.trafficTimedOut:
		return fmt.Sprintf("Drained (%s with %d established connection(s) left)", timedOutText, nd.connections)
	}
	return ""
}

// reportTraffic emits the events of the traffic drain once per change.
func (r *Reconciler) reportTraffic(nm *v1alpha1.NodeMaintenance, node string, nd *nodeDrain) {
	old := oldNodeStatus(nm, node)
	if nd.lbGateExpired && (old == nil || old.TrafficDrainStartTime == nil) && nd.evacuating > 0 && (old == nil || old.PodsEvacuating == 0) {
		event.Publish(r.Recorder, loadBalancersNotDown(nm, node, lbGate))
	}
	if nd.trafficTimedOut && (old == nil || !strings.Contains(old.DrainMessage, timedOutText)) {
		event.Publish(r.Recorder, trafficDrainTimeout(nm, node, nd.connections))
	}
}
