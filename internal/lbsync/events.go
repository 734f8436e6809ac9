package lbsync

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

func adminStateUpdateFailed(node *corev1.Node, state dataplane.AdminState, err error) event.Event {
	return event.Event{Regarding: node, Type: corev1.EventTypeWarning, Reason: lbmodel.ReasonAdminStateUpdateFailed, Action: "AdminState",
		Note: fmt.Sprintf("Could not set this node's load-balancer backends to admin state %s: %v (retrying)", state, err)}
}

func frontendNotServed(svc *corev1.Service, msg string) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeWarning, Reason: ReasonFrontendNotServed, Action: "Serve", Note: msg}
}

func frontendServed(svc *corev1.Service, frontend string) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeNormal, Reason: ReasonFrontendServed, Action: "Serve", Note: "ebb lb serves frontend " + frontend + " again"}
}

func podBackendsUnreachable(svc *corev1.Service, total int) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeWarning, Reason: ReasonPodBackendsUnreachable, Action: "Probe",
		Note: fmt.Sprintf("ebb lb reaches none of the %d pod endpoint(s) of this Service (pod mode sends traffic straight to the pods): either this load-balancer host cannot reach the pod network (route the pod CIDRs to the LB hosts, or allow them in network policies), or the pods do not listen on the target port; new connections are refused meanwhile", total)}
}

func podBackendsReachable(svc *corev1.Service, up, total int) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeNormal, Reason: ReasonPodBackendsReachable, Action: "Probe",
		Note: fmt.Sprintf("ebb lb reaches %d of the %d pod endpoint(s) of this Service again", up, total)}
}

// Reasons of the Events about this replica's own host.
const (
	// ReasonLoadBalancerHostDraining: the host is leaving, so its ebb lb
	// withdrew its announcements and serves only what is established.
	ReasonLoadBalancerHostDraining = "LoadBalancerHostDraining"
	// ReasonLoadBalancerHostServing: the host is no longer leaving, and its
	// ebb lb announces its addresses again.
	ReasonLoadBalancerHostServing = "LoadBalancerHostServing"
	// ReasonLoadBalancerTookOver: a new ebb lb process on the host took
	// over the listening sockets of the one before it (an upgrade or a
	// restart), which serves its established connections until they end.
	ReasonLoadBalancerTookOver = "LoadBalancerTookOver"
	// ReasonLoadBalancerTakeOverFailed: the process before it did not
	// confirm the hand-off; both may have served new connections for a
	// while.
	ReasonLoadBalancerTakeOverFailed = "LoadBalancerTakeOverFailed"
	// ReasonKernelStateRepaired: something else on the host (a firewall
	// reload) removed or changed ebb lb's nftables tables; ebb lb wrote
	// them again.
	ReasonKernelStateRepaired = "KernelStateRepaired"
)

func hostDraining(node *corev1.Node, reason string, connections int) event.Event {
	return event.Event{Regarding: node, Type: corev1.EventTypeNormal, Reason: ReasonLoadBalancerHostDraining, Action: "Drain",
		Note: fmt.Sprintf("This node is leaving (%s): its ebb lb withdrew the load-balancer addresses it announced and serves its %d established connection(s) until they end", reason, connections)}
}

func hostServing(node *corev1.Node) event.Event {
	return event.Event{Regarding: node, Type: corev1.EventTypeNormal, Reason: ReasonLoadBalancerHostServing, Action: "Serve",
		Note: "This node is no longer leaving: its ebb lb announces the load-balancer addresses again"}
}
