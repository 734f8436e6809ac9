package nodemaintenance

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbhost"
)

// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=loadbalancerreports,verbs=get;list;watch

// DefaultTrafficDrainTimeout bounds the wait for connections through a
// drained node when the maintenance does not say.
const DefaultTrafficDrainTimeout = 300 * time.Second

// lbGate is how long a drain waits for the load balancers to report a node
// Down before evacuating anyway (a replica that cannot report must not
// hold a maintenance forever).
const lbGate = 30 * time.Second

// loadBalancerViews reads what the ebb lb replicas report about each node
// (lbhost.ReadViews).
func (r *Reconciler) loadBalancerViews(ctx context.Context) (func(node string) lbhost.View, error) {
	return lbhost.ReadViews(ctx, r.Client, r.LBNamespace, metav1.NewTime(r.Clock.Now()))
}

// trafficDrain decides, for one node, whether evacuation may start (the
// load balancers stopped sending it new connections, or lbGate passed
// since the Drain stage started) and whether its traffic is drained (no
// established connection left, or the maintenance's traffic-drain timeout
// passed since the load balancers went Down).
func (r *Reconciler) trafficDrain(nm *v1alpha1.NodeMaintenance, node string, view lbhost.View, nd *nodeDrain) {
	now := r.Clock.Now()
	started := drainStarted(nm)
	gateExpired := started != nil && now.Sub(started.Time) >= lbGate
	// An unreported replica holds evacuation back, never the count of the
	// connections the reports show.
	nd.lbDown, nd.connections, nd.unknown = view.Down && len(view.Unknown) == 0, view.Connections, view.Unknown
	nd.hostConnections, nd.hostServing = view.HostConnections, view.HostServing
	if old := oldNodeStatus(nm, node); old != nil && old.TrafficDrainStartTime != nil {
		nd.trafficStart = old.TrafficDrainStartTime
	} else if view.Down {
		// The status keeps whole seconds: round up, so that the wait is
		// never shorter than the timeout.
		t := metav1.NewTime(now.Truncate(time.Second).Add(time.Second))
		nd.trafficStart = &t
	}
	if !view.Down {
		if gateExpired {
			// Given up on the load balancers: do not wait on their traffic.
			nd.mayEvacuate, nd.lbGateExpired, nd.trafficDone = true, true, true
		}
		return
	}
	nd.mayEvacuate = nd.lbDown || gateExpired
	nd.lbGateExpired = !nd.lbDown && gateExpired
	timeout := DefaultTrafficDrainTimeout
	if nm.Spec.TrafficDrainTimeoutSeconds != nil {
		timeout = time.Duration(*nm.Spec.TrafficDrainTimeoutSeconds) * time.Second
	}
	deadline := nd.trafficStart.Add(timeout)
	left := deadline.Sub(now)
	switch {
	case view.Connections == 0:
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
	case !nd.lbDown && !nd.lbGateExpired && len(nd.unknown) > 0:
		return fmt.Sprintf("Waiting for ebb lb %s to report (running without a fresh LoadBalancerReport: what it sends the node is not known); evacuation starts anyway %s after the drain began",
			strings.Join(nd.unknown, ", "), lbGate)
	case !nd.lbDown && !nd.lbGateExpired && len(nd.hostServing) > 0:
		return fmt.Sprintf("Waiting for the node's own ebb lb (%s) to withdraw the load-balancer addresses", strings.Join(nd.hostServing, ", "))
	case !nd.lbDown && !nd.lbGateExpired:
		return "Waiting for the load balancers to stop sending new connections to the node"
	case !nd.trafficDone:
		own := ""
		if nd.hostConnections > 0 {
			own = fmt.Sprintf(", %d of them through the node's own ebb lb", nd.hostConnections)
		}
		// The deadline, not a countdown: a countdown would rewrite the
		// status on every reconcile.
		return fmt.Sprintf("Waiting for %d established connection(s) through the load balancers to finish%s (traffic-drain timeout at %s)",
			nd.connections, own, nd.trafficDeadline.UTC().Format(time.RFC3339))
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
		r.Metrics.trafficDrainTimedOut()
	}
}
