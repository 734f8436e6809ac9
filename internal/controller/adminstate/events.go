package adminstate

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/ebbdev/ebb/internal/event"
)

func nodeDown(node *corev1.Node, taint string) event.Event {
	return event.Event{Regarding: node, Type: corev1.EventTypeNormal, Reason: ReasonDown, Action: "AdminState",
		Note: "Load balancers send no new connections to this node (taint " + taint + "); established connections continue"}
}

func nodeBack(node *corev1.Node) event.Event {
	return event.Event{Regarding: node, Type: corev1.EventTypeNormal, Reason: ReasonNone, Action: "AdminState", Note: "The node is back in load-balancer rotation"}
}
