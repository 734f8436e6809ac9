package lbmodel

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/dataplane"
)

func node(name, ip string, mutate ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}},
	}
	for _, m := range mutate {
		m(n)
	}
	return n
}

func tainted(key string) func(*corev1.Node) { return taintedWith(key, "") }

func taintedWith(key, value string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffectNoSchedule})
	}
}

func service(mutate ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			LoadBalancerClass:     ptr.To(ClassL4),
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}},
		},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "10.96.255.1"}}}},
	}
	for _, m := range mutate {
		m(s)
	}
	return s
}

type ep struct {
	ip, node                    string
	ready, serving, terminating *bool
}

func slice(addrType discoveryv1.AddressType, port int32, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		AddressType: addrType,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(port)}},
	}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{e.ip}, NodeName: ptr.To(e.node),
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.terminating},
		})
	}
	return s
}

func be(addr string, port uint16, owner string, state dataplane.AdminState) dataplane.Backend {
	return dataplane.Backend{Address: addr, Port: port, Owner: owner, AdminState: state}
}

var (
	yes, no = ptr.To(true), ptr.To(false)
	none    = dataplane.AdminNone
	down    = dataplane.AdminDown
)

func TestFrontends(t *testing.T) {
	threeNodes := []*corev1.Node{node("n1", "10.0.0.1"), node("n2", "10.0.0.2"), node("n3", "10.0.0.3")}
	readyOn12 := []*discoveryv1.EndpointSlice{slice(discoveryv1.AddressTypeIPv4, 8080, ep{ip: "10.244.1.5", node: "n1"}, ep{ip: "10.244.2.5", node: "n2", ready: yes})}
	tests := []struct {
		name         string
		svc          *corev1.Service
		slices       []*discoveryv1.EndpointSlice
		nodes        []*corev1.Node
		opts         Options
		wantBackends []dataplane.Backend
		wantHC       *dataplane.HealthCheck
		check        func(t *testing.T, fes []dataplane.Frontend)
	}{{
		name: "node mode, Cluster: every eligible node, probed on the node health port", svc: service(), slices: readyOn12, nodes: threeNodes,
		wantBackends: []dataplane.Backend{be("10.0.0.1", 30080, "n1", none), be("10.0.0.2", 30080, "n2", none), be("10.0.0.3", 30080, "n3", none)},
		wantHC:       &dataplane.HealthCheck{Protocol: dataplane.ProbeHTTP, Path: "/healthz", Port: 10256},
	}, {
		name: "a configured node health port", svc: service(), nodes: threeNodes[:1], opts: Options{NodeHealthPort: 9999},
		wantBackends: []dataplane.Backend{be("10.0.0.1", 30080, "n1", none)},
		wantHC:       &dataplane.HealthCheck{Protocol: dataplane.ProbeHTTP, Path: "/healthz", Port: 9999},
	}, {
		name: "excluded and deleting nodes are not backends; a cordoned one is",
		svc:  service(),
		nodes: []*corev1.Node{
			node("n1", "10.0.0.1", func(n *corev1.Node) { n.Labels = map[string]string{ExcludeNodeLabel: ""} }),
			node("n2", "10.0.0.2", func(n *corev1.Node) { n.DeletionTimestamp = &metav1.Time{} }),
			node("n3", "10.0.0.3", func(n *corev1.Node) { n.Spec.Unschedulable = true }),
		},
		wantBackends: []dataplane.Backend{be("10.0.0.3", 30080, "n3", none)},
		wantHC:       &dataplane.HealthCheck{Protocol: dataplane.ProbeHTTP, Path: "/healthz", Port: 10256},
	}, {
		name: "node mode, Local: only nodes with a local endpoint, probed on the healthCheckNodePort",
		svc: service(func(s *corev1.Service) {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32000
		}),
		slices: readyOn12, nodes: threeNodes,
		wantBackends: []dataplane.Backend{be("10.0.0.1", 30080, "n1", none), be("10.0.0.2", 30080, "n2", none)},
		wantHC:       &dataplane.HealthCheck{Protocol: dataplane.ProbeHTTP, Path: "/healthz", Port: 32000},
	}, {
		name: "admin Down for each leaving taint; cordon and other taints leave it None",
		svc:  service(),
		nodes: []*corev1.Node{
			node("n1", "10.0.0.1", tainted(TaintOutOfService)), node("n2", "10.0.0.2", taintedWith(TaintAzureDraining, SpotEvictionValue)),
			node("n3", "10.0.0.3", tainted(TaintDraining)), node("n4", "10.0.0.4", tainted(TaintToBeDeleted)),
			node("n5", "10.0.0.5", tainted(corev1.TaintNodeUnschedulable), func(n *corev1.Node) { n.Spec.Unschedulable = true }),
		},
		wantBackends: []dataplane.Backend{be("10.0.0.1", 30080, "n1", down), be("10.0.0.2", 30080, "n2", down), be("10.0.0.3", 30080, "n3", down), be("10.0.0.4", 30080, "n4", down), be("10.0.0.5", 30080, "n5", none)},
		wantHC:       &dataplane.HealthCheck{Protocol: dataplane.ProbeHTTP, Path: "/healthz", Port: 10256},
	}, {
		name: "the Azure draining key means a spot eviction only with value spot-eviction (seed 000)", svc: service(),
		nodes:        []*corev1.Node{node("n2", "10.0.0.2", taintedWith(TaintAzureDraining, "something-else"))},
		wantBackends: []dataplane.Backend{be("10.0.0.2", 30080, "n2", none)},
		wantHC:       &dataplane.HealthCheck{Protocol: dataplane.ProbeHTTP, Path: "/healthz", Port: 10256},
	}, {
		name: "the autoscaler's taint can be ignored", svc: service(), opts: Options{IgnoreAutoscalerTaint: true},
		nodes:        []*corev1.Node{node("n4", "10.0.0.4", tainted(TaintToBeDeleted))},
		wantBackends: []dataplane.Backend{be("10.0.0.4", 30080, "n4", none)},
		wantHC:       &dataplane.HealthCheck{Protocol: dataplane.ProbeHTTP, Path: "/healthz", Port: 10256},
	}, {
		name: "admin state off: probes decide", svc: service(), opts: Options{AdminStateDisabled: true},
		nodes:        []*corev1.Node{node("n1", "10.0.0.1", tainted(TaintDraining))},
		wantBackends: []dataplane.Backend{be("10.0.0.1", 30080, "n1", none)},
		wantHC:       &dataplane.HealthCheck{Protocol: dataplane.ProbeHTTP, Path: "/healthz", Port: 10256},
	}, {
		name: "pod mode without node ports: ready endpoints at their target port, inheriting their node's admin state",
		svc: service(func(s *corev1.Service) {
			s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
			s.Spec.Ports[0].NodePort = 0
		}),
		slices:       []*discoveryv1.EndpointSlice{slice(discoveryv1.AddressTypeIPv4, 8080, ep{ip: "10.244.1.5", node: "n1"}, ep{ip: "10.244.2.5", node: "n2", ready: no, serving: no})},
		nodes:        []*corev1.Node{node("n1", "10.0.0.1", tainted(TaintDraining)), node("n2", "10.0.0.2")},
		wantBackends: []dataplane.Backend{be("10.244.1.5", 8080, "n1", down)},
		wantHC:       &dataplane.HealthCheck{Protocol: dataplane.ProbeTCP},
	}, {
		name:         "pod mode by annotation, serving-terminating endpoints when none is ready",
		svc:          service(func(s *corev1.Service) { s.Annotations = map[string]string{BackendModeAnnotation: "pod"} }),
		slices:       []*discoveryv1.EndpointSlice{slice(discoveryv1.AddressTypeIPv4, 8080, ep{ip: "10.244.1.5", node: "n1", ready: no, serving: yes, terminating: yes}, ep{ip: "10.244.1.6", node: "n1", ready: no, serving: no, terminating: yes})},
		nodes:        threeNodes,
		wantBackends: []dataplane.Backend{be("10.244.1.5", 8080, "n1", none)},
		wantHC:       &dataplane.HealthCheck{Protocol: dataplane.ProbeTCP},
	}, {
		name: "pod mode, a UDP port: no probe (a TCP connect to a UDP port fails), the slice's readiness decides",
		svc: service(func(s *corev1.Service) {
			s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
			s.Spec.Ports[0].NodePort, s.Spec.Ports[0].Protocol = 0, corev1.ProtocolUDP
		}),
		slices: []*discoveryv1.EndpointSlice{func() *discoveryv1.EndpointSlice {
			s := slice(discoveryv1.AddressTypeIPv4, 8080, ep{ip: "10.244.1.5", node: "n1"}, ep{ip: "10.244.2.5", node: "n2", ready: yes})
			s.Ports[0].Protocol = ptr.To(corev1.ProtocolUDP)
			return s
		}()},
		nodes:        threeNodes,
		wantBackends: []dataplane.Backend{be("10.244.1.5", 8080, "n1", none), be("10.244.2.5", 8080, "n2", none)},
	}, {
		name: "an IPv6 address takes IPv6 node addresses",
		svc: service(func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "fd00:96::1"}}
		}),
		nodes: []*corev1.Node{node("n1", "10.0.0.1", func(n *corev1.Node) {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "fd00::1"})
		}), node("n2", "10.0.0.2")},
		wantBackends: []dataplane.Backend{be("fd00::1", 30080, "n1", none)},
		wantHC:       &dataplane.HealthCheck{Protocol: dataplane.ProbeHTTP, Path: "/healthz", Port: 10256},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fes, err := Frontends(tt.svc, tt.slices, tt.nodes, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(fes) != 1 {
				t.Fatalf("%d frontends, want 1: %+v", len(fes), fes)
			}
			if !reflect.DeepEqual(fes[0].Backends, tt.wantBackends) {
				t.Errorf("backends\n got %+v\nwant %+v", fes[0].Backends, tt.wantBackends)
			}
			if !reflect.DeepEqual(fes[0].HealthCheck, tt.wantHC) {
				t.Errorf("health check %+v, want %+v", fes[0].HealthCheck, tt.wantHC)
			}
			if _, err := (dataplane.Config{Frontends: fes}).Validate(); err != nil {
				t.Errorf("the data plane rejects the frontends: %v", err)
			}
		})
	}
}

func TestFrontendSettings(t *testing.T) {
	svc := service(func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.LoadBalancerSourceRanges = []string{" 192.0.2.0/24 ", "198.51.100.0/24"}
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "dns", Port: 53, NodePort: 30053, Protocol: corev1.ProtocolUDP})
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{Hostname: "lb.example.com"})
	})
	fes, err := Frontends(svc, nil, []*corev1.Node{node("n1", "10.0.0.1")}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(fes) != 2 {
		t.Fatalf("%d frontends, want a TCP and a UDP one (the hostname ingress is not ours): %+v", len(fes), fes)
	}
	udp, tcp := fes[0], fes[1]
	if tcp.Name != "ns/web:http/TCP@10.96.255.1" || udp.Name != "ns/web:dns/UDP@10.96.255.1" || udp.Protocol != dataplane.UDP || udp.Port != 53 {
		t.Errorf("frontends %s %s %s %d", tcp.Name, udp.Name, udp.Protocol, udp.Port)
	}
	for _, fe := range fes {
		if fe.Balancing != dataplane.ClientIP {
			t.Errorf("%s: balancing %s, want ClientIP for session affinity", fe.Name, fe.Balancing)
		}
		if !reflect.DeepEqual(fe.SourceRanges, []string{"192.0.2.0/24", "198.51.100.0/24"}) {
			t.Errorf("%s: source ranges %q", fe.Name, fe.SourceRanges)
		}
	}
}

// lb.ebb.dev/proxy-protocol: v2 asks for a PROXY protocol v2 header on
// each TCP port's connections (the UDP port has none), and the data plane
// takes the frontends; any other value asks for nothing.
func TestProxyProtocolAnnotation(t *testing.T) {
	tests := []struct {
		value   string
		wantTCP bool
	}{{"v2", true}, {"v1", false}, {"", false}}
	for _, tt := range tests {
		svc := service(func(s *corev1.Service) {
			s.Annotations = map[string]string{ProxyProtocolAnnotation: tt.value}
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "dns", Port: 53, NodePort: 30053, Protocol: corev1.ProtocolUDP})
		})
		fes, err := Frontends(svc, nil, []*corev1.Node{node("n1", "10.0.0.1")}, Options{})
		if err != nil || len(fes) != 2 {
			t.Fatalf("%q: frontends %+v, err %v", tt.value, fes, err)
		}
		udp, tcp := fes[0], fes[1]
		if tcp.ProxyProtocol != tt.wantTCP || udp.ProxyProtocol {
			t.Errorf("%q: PROXY protocol on TCP %t, on UDP %t; want %t, false", tt.value, tcp.ProxyProtocol, udp.ProxyProtocol, tt.wantTCP)
		}
		if _, err := (dataplane.Config{Frontends: fes}).Validate(); err != nil {
			t.Errorf("%q: the data plane rejects the frontends: %v", tt.value, err)
		}
	}
}

func TestUnsupportedProtocol(t *testing.T) {
	svc := service(func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "sig", Port: 3868, NodePort: 30868, Protocol: corev1.ProtocolSCTP})
	})
	fes, err := Frontends(svc, nil, []*corev1.Node{node("n1", "10.0.0.1")}, Options{})
	if !IsUnsupportedPort(err) || !strings.Contains(err.Error(), "sig") || !strings.Contains(err.Error(), "use TCP or UDP") {
		t.Fatalf("error %v", err)
	}
	if len(fes) != 1 || fes[0].Port != 80 {
		t.Errorf("the TCP port must still be served: %+v", fes)
	}
}

func TestNoAddressNoFrontends(t *testing.T) {
	svc := service(func(s *corev1.Service) { s.Status = corev1.ServiceStatus{} })
	if fes, err := Frontends(svc, nil, []*corev1.Node{node("n1", "10.0.0.1")}, Options{}); err != nil || len(fes) != 0 {
		t.Errorf("frontends %+v, err %v", fes, err)
	}
}

func TestModeOf(t *testing.T) {
	tests := []struct {
		name string
		svc  *corev1.Service
		want BackendMode
	}{
		{"node ports", service(), NodeMode},
		{"node ports off and removed", service(func(s *corev1.Service) {
			s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
			s.Spec.Ports[0].NodePort = 0
		}), PodMode},
		// KEP-1864 keeps existing node ports when the field turns false.
		{"node ports off but kept", service(func(s *corev1.Service) { s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false) }), NodeMode},
		{"one port's node port removed", service(func(s *corev1.Service) {
			s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "b", Port: 81, NodePort: 30081})
			s.Spec.Ports[0].NodePort = 0
		}), PodMode},
		{"node ports not allocated yet", service(func(s *corev1.Service) { s.Spec.Ports[0].NodePort = 0 }), PodMode},
		{"annotation", service(func(s *corev1.Service) { s.Annotations = map[string]string{BackendModeAnnotation: "pod"} }), PodMode},
	}
	for _, tt := range tests {
		if got := ModeOf(tt.svc); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
}
