package nodeproxy

import (
	"net"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// endpointsFor returns the addresses (ip:port) that traffic for one Service
// port may go to from node, following kube-proxy: ready endpoints, or when
// none is ready, the serving ones that are terminating. With local set
// (externalTrafficPolicy Local) only endpoints on node count. The result is
// sorted so callers behave the same for the same state.
func endpointsFor(slices []*discoveryv1.EndpointSlice, portName string, proto corev1.Protocol, node string, local bool) []string {
	var ready, terminating []string
	for _, slice := range slices {
		if slice.AddressType != discoveryv1.AddressTypeIPv4 && slice.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		port, ok := slicePort(slice, portName, proto)
		if !ok {
			continue
		}
		for _, ep := range slice.Endpoints {
			if local && (ep.NodeName == nil || *ep.NodeName != node) {
				continue
			}
			if len(ep.Addresses) == 0 {
				continue
			}
			addr := net.JoinHostPort(ep.Addresses[0], strconv.Itoa(int(port)))
			switch {
			case isTrue(ep.Conditions.Ready, true):
				ready = append(ready, addr)
			case isTrue(ep.Conditions.Serving, false) && isTrue(ep.Conditions.Terminating, false):
				terminating = append(terminating, addr)
			}
		}
	}
	out := ready
	if len(out) == 0 {
		out = terminating
	}
	sort.Strings(out)
	return out
}

// readyLocalEndpoints counts the ready endpoints of a Service on node, as
// kube-proxy's health check server reports them.
func readyLocalEndpoints(slices []*discoveryv1.EndpointSlice, node string) int {
	seen := map[string]bool{}
	for _, slice := range slices {
		for _, ep := range slice.Endpoints {
			if ep.NodeName != nil && *ep.NodeName == node && isTrue(ep.Conditions.Ready, true) && len(ep.Addresses) > 0 {
				seen[ep.Addresses[0]] = true
			}
		}
	}
	return len(seen)
}

func slicePort(slice *discoveryv1.EndpointSlice, name string, proto corev1.Protocol) (int32, bool) {
	for _, p := range slice.Ports {
		pName := ""
		if p.Name != nil {
			pName = *p.Name
		}
		pProto := corev1.ProtocolTCP
		if p.Protocol != nil {
			pProto = *p.Protocol
		}
		if pName == name && pProto == proto && p.Port != nil {
			return *p.Port, true
		}
	}
	return 0, false
}

// isTrue reads an optional condition; nil means def (the API's defaults:
// ready is assumed when unset).
func isTrue(b *bool, def bool) bool {
	if b == nil {
		return def
	}
	return *b
}
