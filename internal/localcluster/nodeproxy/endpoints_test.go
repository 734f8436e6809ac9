package nodeproxy

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

type ep struct {
	ip, node                    string
	ready, serving, terminating *bool
}

func slice(portName string, proto corev1.Protocol, port int32, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(portName), Protocol: ptr.To(proto), Port: ptr.To(port)}},
	}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.ip},
			NodeName:   ptr.To(e.node),
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.terminating},
		})
	}
	return s
}

func TestEndpointsFor(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	tests := []struct {
		name     string
		slices   []*discoveryv1.EndpointSlice
		portName string
		proto    corev1.Protocol
		local    bool
		want     []string
	}{{
		name:     "ready endpoints on every node for Cluster",
		slices:   []*discoveryv1.EndpointSlice{slice("http", corev1.ProtocolTCP, 8080, ep{ip: "10.244.2.1", node: "b", ready: yes}, ep{ip: "10.244.1.1", node: "a", ready: yes})},
		portName: "http", proto: corev1.ProtocolTCP,
		want: []string{"10.244.1.1:8080", "10.244.2.1:8080"},
	}, {
		name:     "unset ready means ready",
		slices:   []*discoveryv1.EndpointSlice{slice("http", corev1.ProtocolTCP, 8080, ep{ip: "10.244.1.1", node: "a"})},
		portName: "http", proto: corev1.ProtocolTCP,
		want: []string{"10.244.1.1:8080"},
	}, {
		name:     "only the local node's endpoints for Local",
		slices:   []*discoveryv1.EndpointSlice{slice("http", corev1.ProtocolTCP, 8080, ep{ip: "10.244.1.1", node: "a", ready: yes}, ep{ip: "10.244.2.1", node: "b", ready: yes})},
		portName: "http", proto: corev1.ProtocolTCP, local: true,
		want: []string{"10.244.1.1:8080"},
	}, {
		name:     "not ready endpoints are skipped",
		slices:   []*discoveryv1.EndpointSlice{slice("http", corev1.ProtocolTCP, 8080, ep{ip: "10.244.1.1", node: "a", ready: no, serving: no}, ep{ip: "10.244.2.1", node: "b", ready: yes})},
		portName: "http", proto: corev1.ProtocolTCP,
		want: []string{"10.244.2.1:8080"},
	}, {
		name:     "serving terminating endpoints only when none is ready",
		slices:   []*discoveryv1.EndpointSlice{slice("http", corev1.ProtocolTCP, 8080, ep{ip: "10.244.1.1", node: "a", ready: no, serving: yes, terminating: yes})},
		portName: "http", proto: corev1.ProtocolTCP,
		want: []string{"10.244.1.1:8080"},
	}, {
		name: "port name and protocol must match",
		slices: []*discoveryv1.EndpointSlice{
			slice("http", corev1.ProtocolUDP, 8081, ep{ip: "10.244.1.1", node: "a", ready: yes}),
			slice("metrics", corev1.ProtocolTCP, 9090, ep{ip: "10.244.1.1", node: "a", ready: yes}),
		},
		portName: "http", proto: corev1.ProtocolTCP,
		want: nil,
	}, {
		name:   "endpoints across slices",
		slices: []*discoveryv1.EndpointSlice{slice("", corev1.ProtocolTCP, 80, ep{ip: "10.244.1.1", node: "a", ready: yes}), slice("", corev1.ProtocolTCP, 80, ep{ip: "10.244.3.1", node: "c", ready: yes})},
		proto:  corev1.ProtocolTCP,
		want:   []string{"10.244.1.1:80", "10.244.3.1:80"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := endpointsFor(tt.slices, tt.portName, tt.proto, "a", tt.local)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("endpointsFor() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestReadyLocalEndpoints(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	slices := []*discoveryv1.EndpointSlice{
		slice("http", corev1.ProtocolTCP, 8080, ep{ip: "10.244.1.1", node: "a", ready: yes}, ep{ip: "10.244.1.2", node: "a", ready: no, serving: yes, terminating: yes}, ep{ip: "10.244.2.1", node: "b", ready: yes}),
		// The same endpoint in a second slice (another port) counts once.
		slice("udp", corev1.ProtocolUDP, 8081, ep{ip: "10.244.1.1", node: "a", ready: yes}),
	}
	if got := readyLocalEndpoints(slices, "a"); got != 1 {
		t.Errorf("node a: %d ready local endpoints, want 1", got)
	}
	if got := readyLocalEndpoints(slices, "c"); got != 0 {
		t.Errorf("node c: %d ready local endpoints, want 0", got)
	}
}
