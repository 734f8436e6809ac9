package spot

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbhost"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// Event reasons of the spot controller besides lbmodel.ReasonSpotEvictionTainted.
const (
	// ReasonSpotSignalRefused: a PreemptScheduled Event about the node
	// came from no trusted emitter, and was ignored.
	ReasonSpotSignalRefused = "SpotSignalRefused"
	// ReasonSpotEvictionHeld: the node hosts the last serving ebb lb, so it
	// keeps serving until the machine goes.
	ReasonSpotEvictionHeld = "SpotEvictionHeldForLastLoadBalancerHost"
)

// taintedForSpotEviction says a node scheduled for a spot eviction (the
// Event ev) was tainted as leaving; replaced is the value of the same
// taint it had before, if any.
func taintedForSpotEviction(node *corev1.Node, ev *corev1.Event, taintKey, replaced string) event.Event {
	note := "Spot eviction scheduled: tainted " + taintKey + "=" + TaintValue + ":NoSchedule so load balancers stop sending new connections"
	if replaced != "" {
		note += fmt.Sprintf(" (the taint's value was %q, which does not mark a node leaving)", replaced)
	}
	return event.Event{Regarding: node, Related: ev, Type: corev1.EventTypeNormal, Reason: lbmodel.ReasonSpotEvictionTainted, Action: "Taint", Note: note}
}

// signalRefused says a PreemptScheduled Event about node was not acted on,
// and why.
// The note names the Event's namespace, not the Event, and nothing is
// related: repeated forgeries from one place are then one series of
// Events (events.k8s.io merges isomorphic Events), not one each.
func signalRefused(node *corev1.Node, ev *corev1.Event, why string) event.Event {
	return event.Event{Regarding: node, Type: corev1.EventTypeWarning, Reason: ReasonSpotSignalRefused, Action: "Taint",
		Note: fmt.Sprintf("Ignored a PreemptScheduled Event about this node from namespace %q: %s", ev.Namespace, why)}
}

// heldForLastLBHost says node, scheduled for a spot eviction, was not
// marked leaving because every serving ebb lb runs on it or on nodes
// leaving already.
func heldForLastLBHost(node *corev1.Node, ev *corev1.Event, s lbhost.Stranding) event.Event {
	return event.Event{Regarding: node, Related: ev, Type: corev1.EventTypeWarning, Reason: ReasonSpotEvictionHeld, Action: "Taint",
		Note: fmt.Sprintf("Spot eviction scheduled, but the node is not marked leaving: every serving ebb lb (%s) runs on it or on a node leaving already, "+
			"so every load-balancer address would go offline at once. It serves until the machine goes; make another node a load-balancer host (label it ebb.dev/load-balancer=true) and it is marked leaving",
			strings.Join(s.Stranded, ", "))}
}
