package azureadminstate

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/provider/azure"
)

// nodeStateFailed is on the node whose backends could not be set.
func nodeStateFailed(n *corev1.Node, reason string, s azure.State, err error) event.Event {
	return event.Event{Regarding: n, Type: corev1.EventTypeWarning, Reason: reason, Action: "AdminState",
		Note: fmt.Sprintf("Could not set this node's Azure load balancer backends to admin state %s: %v (retrying; no further event until it changes)", s, err)}
}

// serviceStateFailed is on a Service whose traffic those nodes carry.
func serviceStateFailed(svc *corev1.Service, reason string, nodes []string, err error) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeWarning, Reason: reason, Action: "AdminState",
		Note: fmt.Sprintf("Could not set the Azure load balancer admin state of node(s) %s, which carry this Service's traffic: %v", strings.Join(nodes, ", "), err)}
}
