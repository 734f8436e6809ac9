package service

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

func syncFailed(svc *corev1.Service, err error) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeWarning, Reason: ReasonSyncFailed, Action: "Ensure", Note: err.Error()}
}

func allocationFailed(svc *corev1.Service, err error) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeWarning, Reason: ReasonSyncFailed, Action: "Ensure", Note: "Error allocating an address: " + err.Error()}
}

func ensuring(svc *corev1.Service) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeNormal, Reason: ReasonEnsuring, Action: "Ensure", Note: "Ensuring load balancer"}
}

func ensured(svc *corev1.Service, addrs []netip.Addr) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeNormal, Reason: ReasonEnsured, Action: "Ensure", Note: fmt.Sprintf("Ensured load balancer at %s", joinAddrs(addrs))}
}

func deleting(svc *corev1.Service) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeNormal, Reason: ReasonDeleting, Action: "Delete", Note: "Deleting load balancer"}
}

func deleted(svc *corev1.Service) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeNormal, Reason: ReasonDeleted, Action: "Delete", Note: "Deleted load balancer"}
}

func portCollision(svc *corev1.Service, collisions []string) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeWarning, Reason: ReasonAddressPortCollision, Action: "Ensure",
		Note: fmt.Sprintf("This Service shares its address, and %s: each port is served for the Service that had it first; change the port, or the lb.ebb.dev/allow-shared-ip key of one Service", strings.Join(collisions, "; "))}
}

func nodePortsKept(svc *corev1.Service) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeNormal, Reason: ReasonNodePortsKept, Action: "Ensure",
		Note: "allocateLoadBalancerNodePorts is false, but the Service keeps its node ports, so traffic still goes through them (node mode); remove every port's nodePort to send it straight to the pods (pod mode)"}
}

// keepsNodePorts reports whether svc turned allocateLoadBalancerNodePorts
// off but keeps its node ports, which KEP-1864 does not release by itself:
// ebb goes on serving it in node mode, and says so.
func keepsNodePorts(svc *corev1.Service) bool {
	off := svc.Spec.AllocateLoadBalancerNodePorts != nil && !*svc.Spec.AllocateLoadBalancerNodePorts
	return off && lbmodel.ModeOf(svc) == lbmodel.NodeMode
}

func familyUnavailable(svc *corev1.Service, why string) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeNormal, Reason: ReasonAddressFamilyUnavailable, Action: "Ensure", Note: why}
}

func clientAddressNotPreserved(svc *corev1.Service) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeNormal, Reason: ReasonClientAddressNotPreserved, Action: "Ensure",
		Note: "externalTrafficPolicy is Local, but ebb's load balancer proxies or masquerades connections, so the backends see a load-balancer host's address rather than the client's (docs/service-lb.md, \"The client's address\"); annotate the Service " + lbmodel.ProxyProtocolAnnotation + ": " + lbmodel.ProxyProtocolV2 + " if they read a PROXY protocol v2 header (TCP ports, proxy engine)"}
}

func badProxyProtocol(svc *corev1.Service, value string) event.Event {
	return event.Event{Regarding: svc, Type: corev1.EventTypeWarning, Reason: ReasonSyncFailed, Action: "Ensure",
		Note: fmt.Sprintf("annotation %s is %q, and the one value ebb knows is %s: no PROXY header is sent until it is %s or removed", lbmodel.ProxyProtocolAnnotation, value, lbmodel.ProxyProtocolV2, lbmodel.ProxyProtocolV2)}
}

func addressConflict(svc *corev1.Service, addr netip.Addr, others []types.NamespacedName) event.Event {
	names := make([]string, len(others))
	for i, o := range others {
		names[i] = o.String()
	}
	return event.Event{Regarding: svc, Type: corev1.EventTypeWarning, Reason: ReasonAddressConflict, Action: "Ensure",
		Note: fmt.Sprintf("The address %s in this Service's status is also %s's, which may not share it (two controllers gave it out at once, or someone wrote the status): this Service gives it up for another address, or for none until one is free", addr, strings.Join(names, ", "))}
}
