package lbmodel

import (
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServedCondition is the condition ebb's controller keeps on the Services
// it serves. False (reason ReasonAwaitingLoadBalancerHosts): addresses
// are allocated, and the LB hosts serve them, but the status does not
// show them until one ebb lb replica reports them served and announced,
// so that no client connects before anything takes its traffic (its
// first SYN would be lost, and TCP retries only after a second). True
// (reason ReasonServed): every allocated address is in the status.
//
// The allocated addresses that wait are in the condition's message: the
// Service's status is written only by holders of services/status (ebb's
// controller, cloud controllers), never by a tenant, so ebb lb may take
// them from there as it takes status.loadBalancer.ingress.
const ServedCondition = "lb.ebb.dev/Served"

// Reasons of ServedCondition.
const (
	ReasonAwaitingLoadBalancerHosts = "AwaitingLoadBalancerHosts"
	ReasonServed                    = "Served"
)

// awaitingPrefix and awaitingSuffix frame the addresses in the message
// of a False ServedCondition.
const (
	awaitingPrefix = "allocated "
	awaitingSuffix = "; published in status.loadBalancer.ingress once an LB host serves and announces them"
)

// AwaitingCondition is the False ServedCondition for addresses allocated
// but not published yet.
func AwaitingCondition(addrs []netip.Addr, generation int64) metav1.Condition {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return metav1.Condition{Type: ServedCondition, Status: metav1.ConditionFalse, Reason: ReasonAwaitingLoadBalancerHosts,
		ObservedGeneration: generation, Message: awaitingPrefix + strings.Join(s, ", ") + awaitingSuffix}
}

// ServedConditionTrue is the True ServedCondition.
func ServedConditionTrue(generation int64) metav1.Condition {
	return metav1.Condition{Type: ServedCondition, Status: metav1.ConditionTrue, Reason: ReasonServed,
		ObservedGeneration: generation, Message: "every allocated address is published in status.loadBalancer.ingress"}
}

// AwaitingAddresses returns the addresses a False ServedCondition says are
// allocated to the Service and not published yet; none when there is no
// such condition or its message is not one AwaitingCondition wrote.
func AwaitingAddresses(svc *corev1.Service) []netip.Addr {
	c := meta.FindStatusCondition(svc.Status.Conditions, ServedCondition)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonAwaitingLoadBalancerHosts {
		return nil
	}
	list, ok := strings.CutPrefix(c.Message, awaitingPrefix)
	if !ok {
		return nil
	}
	if list, ok = strings.CutSuffix(list, awaitingSuffix); !ok {
		return nil
	}
	var out []netip.Addr
	for _, s := range strings.Split(list, ", ") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil
		}
		out = append(out, a.Unmap())
	}
	return out
}

// Addresses returns the Service's load-balancer addresses, each once: the
// ones published in its status, then the ones allocated and awaiting an LB
// host (AwaitingAddresses). Hostname ingresses are not ebb's and are left
// out. An address is kept in the form it was written (an IPv4-mapped IPv6
// address stays one: its frontend is what the status says).
func Addresses(svc *corev1.Service) []netip.Addr {
	var out []netip.Addr
	add := func(a netip.Addr) {
		for _, x := range out {
			if x == a {
				return
			}
		}
		out = append(out, a)
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(ing.IP); err == nil {
			add(a)
		}
	}
	for _, a := range AwaitingAddresses(svc) {
		add(a)
	}
	return out
}
