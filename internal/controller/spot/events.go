package spot

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// taintedForSpotEviction says a node scheduled for a spot eviction (the Event ev) was
// tainted as leaving.
func taintedForSpotEviction(node *corev1.Node, ev *corev1.Event, taintKey string) event.Event {
	return event.Event{Regarding: node, Related: ev, Type: corev1.EventTypeNormal, Reason: lbmodel.ReasonSpotEvictionTainted, Action: "Taint",
		Note: "Spot eviction scheduled: tainted " + taintKey + "=" + TaintValue + ":NoSchedule so load balancers stop sending new connections"}
}
