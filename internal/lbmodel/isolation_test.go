package lbmodel

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/dataplane"
)

// The invariant behind the outside review's findings (issue 50 item 5):
// whatever odd objects the API server accepts beside them, a well-formed
// Service keeps every frontend it should have, each valid for the data
// plane, with every backend it should have; and no two Services' frontends
// share a name. The odd objects are a second Service, extra Nodes and
// extra endpoints in both Services' slices, decoded from the fuzzer's
// bytes. `make test` fuzzes it for a short while, `make fuzz` longer.

// oddAddresses are address forms the API server accepts in some field of
// some object (an IPv4-mapped IPv6 address passes IPv4 validation; leading
// zeros are kept on objects stored before Kubernetes 1.36), and a few it
// refuses, for objects from elsewhere.
var oddAddresses = []string{
	"10.0.0.11", "10.0.0.12", "10.0.0.13", // the good Service's nodes and pods
	"10.0.0.21", "10.0.0.22",
	"::ffff:10.0.0.11", "::ffff:10.0.0.21",
	"010.000.000.011", "010.0.0.21",
	"fd00::11", "fd00::21", "::ffff:a00:b",
	"10.96.255.1", "10.96.255.2", "::ffff:10.96.255.1", "fd00:96::1",
	"0.0.0.0", "::", "255.255.255.255", "127.0.0.1",
	"", "not-an-ip", "10.0.0.300", "fe80::1%eth0", "10.0.0.0/24",
}

// oddRanges are source ranges, as written in a Service.
var oddRanges = []string{
	"192.0.2.0/24", "010.0.0.0/8", "10.0.0.1/32", "2001:db8::/32", "::ffff:10.0.0.0/104",
	"0.0.0.0/0", "10.0.0.0/33", "garbage", " 192.0.2.0/24 ", "",
}

var oddNames = []string{"", "http", "dns", "metrics", "HTTP", "a-b"}

// byteSource hands out the fuzzer's bytes; zeros once they run out.
type byteSource struct {
	b []byte
	i int
}

func (s *byteSource) next() int {
	if s.i >= len(s.b) {
		return 0
	}
	s.i++
	return int(s.b[s.i-1])
}

func (s *byteSource) pick(n int) int { return s.next() % n }

// goodService serves 10.96.255.1 and fd00:96::1 on TCP 80 and UDP 53
// from nodes node-1..3 (10.0.0.11-13, fd00::11-13) or, in pod mode, pods
// 10.0.0.21-22 and fd00::21-22 on port 8080 (TCP) and 5353 (UDP).
func goodService(pod bool) (*corev1.Service, []*discoveryv1.EndpointSlice, []*corev1.Node) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "good", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:              corev1.ServiceTypeLoadBalancer,
			LoadBalancerClass: ptr.To(ClassL4),
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP},
				{Name: "dns", Port: 53, NodePort: 30053, Protocol: corev1.ProtocolUDP},
			},
		},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "10.96.255.1"}, {IP: "fd00:96::1"}}}},
	}
	if pod {
		svc.Annotations = map[string]string{BackendModeAnnotation: string(PodMode)}
	}
	var nodes []*corev1.Node
	for i := 1; i <= 3; i++ {
		nodes = append(nodes, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i)},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.0.0.1%d", i)},
				{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("fd00::1%d", i)},
			}},
		})
	}
	var slices []*discoveryv1.EndpointSlice
	for _, family := range []struct {
		typ    discoveryv1.AddressType
		prefix string
	}{{discoveryv1.AddressTypeIPv4, "10.0.0.2"}, {discoveryv1.AddressTypeIPv6, "fd00::2"}} {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "good", Name: "web-" + string(family.typ), Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: family.typ,
			Ports: []discoveryv1.EndpointPort{
				{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)},
				{Name: ptr.To("dns"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](5353)},
			},
		}
		for i := 1; i <= 2; i++ {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("%s%d", family.prefix, i)}, NodeName: ptr.To(fmt.Sprintf("node-%d", i))})
		}
		slices = append(slices, s)
	}
	return svc, slices, nodes
}

// wantBackends are the good Service's backends per frontend name: address
// and port, whatever their owner.
func wantBackends(svc *corev1.Service, pod bool) map[string][]netip.AddrPort {
	out := map[string][]netip.AddrPort{}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		vip := netip.MustParseAddr(ing.IP)
		for _, p := range svc.Spec.Ports {
			name := frontendFor(svc, vip, p).Name
			for i := 1; i <= 3; i++ {
				host, port := fmt.Sprintf("10.0.0.1%d", i), uint16(p.NodePort)
				if pod {
					if i == 3 {
						break
					}
					host, port = fmt.Sprintf("10.0.0.2%d", i), 8080
					if p.Protocol == corev1.ProtocolUDP {
						port = 5353
					}
				}
				addr := netip.MustParseAddr(host)
				if vip.Is6() {
					addr = netip.MustParseAddr("fd00::" + host[len("10.0.0."):])
				}
				out[name] = append(out[name], netip.AddrPortFrom(addr, port))
			}
		}
	}
	return out
}

// addOddObjects adds what src says: endpoints to the slices, nodes, and a
// second Service with its own slice.
func addOddObjects(src *byteSource, slices []*discoveryv1.EndpointSlice, nodes []*corev1.Node) (*corev1.Service, []*discoveryv1.EndpointSlice, []*corev1.Node) {
	for n := src.pick(4); n > 0; n-- {
		s := slices[src.pick(len(slices))]
		ep := discoveryv1.Endpoint{NodeName: ptr.To(fmt.Sprintf("node-%d", src.pick(6)))}
		for k := src.pick(3); k > 0; k-- {
			ep.Addresses = append(ep.Addresses, oddAddresses[src.pick(len(oddAddresses))])
		}
		switch src.pick(4) {
		case 1:
			ep.Conditions.Ready = ptr.To(false)
		case 2:
			ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	for n := src.pick(4); n > 0; n-- {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("odd-%d", n)}}
		for k := src.pick(3); k > 0; k-- {
			typ := corev1.NodeInternalIP
			if src.pick(4) == 0 {
				typ = corev1.NodeExternalIP
			}
			node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: typ, Address: oddAddresses[src.pick(len(oddAddresses))]})
		}
		if src.pick(3) == 0 {
			node.Spec.Taints = []corev1.Taint{{Key: TaintDraining, Effect: corev1.TaintEffectNoSchedule}}
		}
		nodes = append(nodes, node)
	}

	odd := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "odd", Name: "svc"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(ClassL4)},
	}
	if src.pick(2) == 0 {
		odd.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		odd.Spec.HealthCheckNodePort = int32(src.next())
	}
	if src.pick(2) == 0 {
		odd.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	}
	protocols := []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP, ""}
	for n := src.pick(4); n > 0; n-- {
		odd.Spec.Ports = append(odd.Spec.Ports, corev1.ServicePort{
			Name: oddNames[src.pick(len(oddNames))], Protocol: protocols[src.pick(len(protocols))],
			Port: int32(src.next()<<8 | src.next()), NodePort: int32(src.next()),
		})
	}
	for n := src.pick(4); n > 0; n-- {
		odd.Status.LoadBalancer.Ingress = append(odd.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: oddAddresses[src.pick(len(oddAddresses))]})
	}
	for n := src.pick(3); n > 0; n-- {
		odd.Spec.LoadBalancerSourceRanges = append(odd.Spec.LoadBalancerSourceRanges, oddRanges[src.pick(len(oddRanges))])
	}
	oddSlice := &discoveryv1.EndpointSlice{AddressType: []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN}[src.pick(3)]}
	for n := src.pick(3); n > 0; n-- {
		p := discoveryv1.EndpointPort{Name: ptr.To(oddNames[src.pick(len(oddNames))])}
		if src.pick(3) > 0 {
			p.Port = ptr.To(int32(src.next()))
		}
		if src.pick(2) == 0 {
			p.Protocol = ptr.To(protocols[src.pick(len(protocols))])
		}
		oddSlice.Ports = append(oddSlice.Ports, p)
	}
	for n := src.pick(4); n > 0; n-- {
		oddSlice.Endpoints = append(oddSlice.Endpoints, discoveryv1.Endpoint{Addresses: []string{oddAddresses[src.pick(len(oddAddresses))]}, NodeName: ptr.To(fmt.Sprintf("node-%d", src.pick(4)))})
	}
	return odd, []*discoveryv1.EndpointSlice{oddSlice}, nodes
}

func FuzzOneOddObjectBreaksNoOtherService(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{3, 0, 1, 2, 5, 0, 1, 2, 3, 7, 1, 2})
	f.Add([]byte{1, 3, 1, 1, 5, 0, 0, 1, 1, 0})          // a mapped address beside its IPv4 form
	f.Add([]byte{1, 0, 1, 1, 7, 1, 1, 1, 1, 7, 0, 0, 0}) // a leading-zero address
	f.Add([]byte{0, 3, 2, 0, 12, 0, 0, 1, 5, 0, 0, 2, 0, 1, 0, 80, 30, 3, 12, 15, 24, 2, 1, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		src := &byteSource{b: data}
		pod := src.pick(2) == 1
		good, goodSlices, nodes := goodService(pod)
		odd, oddSlices, nodes := addOddObjects(src, goodSlices, nodes)

		fes, err := Frontends(good, goodSlices, nodes, Options{})
		if err != nil {
			t.Fatalf("the good Service is reported partly unserved: %v", err)
		}
		want := wantBackends(good, pod)
		if len(fes) != len(want) {
			t.Fatalf("the good Service has %d frontends, want %d", len(fes), len(want))
		}
		for _, fe := range fes {
			if _, err := (dataplane.Config{Frontends: []dataplane.Frontend{fe}}).Validate(); err != nil {
				t.Fatalf("the good Service's frontend %s is refused by the data plane: %v", fe.Name, err)
			}
			have := map[netip.AddrPort]bool{}
			for _, b := range fe.Backends {
				have[b.AddrPort()] = true
			}
			for _, w := range want[fe.Name] {
				if !have[w] {
					t.Fatalf("the good Service's frontend %s lost backend %s; has %v", fe.Name, w, fe.Backends)
				}
			}
		}

		// The odd Service's own defects are not dropped in silence: each
		// port of each address is a frontend (which the data plane refuses
		// and ebb lb reports as FrontendNotServed if it is invalid) or is
		// named in the error (the controller's event).
		oddFes, err := Frontends(odd, oddSlices, nodes, Options{})
		var unsupported []string
		if u, ok := err.(*UnsupportedPortError); ok {
			unsupported = u.Ports
		} else if err != nil {
			t.Fatalf("the odd Service: %v", err)
		}
		made := map[string]bool{}
		for _, fe := range oddFes {
			made[fe.Name] = true
		}
		for _, ing := range odd.Status.LoadBalancer.Ingress {
			vip, err := netip.ParseAddr(ing.IP)
			if err != nil {
				continue // not an address: a hostname ingress is another implementation's
			}
			for _, p := range odd.Spec.Ports {
				if !made[frontendFor(odd, vip, p).Name] && !slices.Contains(unsupported, portName(p)) {
					t.Fatalf("the odd Service's port %s on %s is neither served nor reported", portName(p), vip)
				}
			}
		}
		goodNames := map[string]bool{}
		for _, fe := range fes {
			goodNames[fe.Name] = true
		}
		for _, fe := range oddFes {
			if goodNames[fe.Name] {
				t.Fatalf("the odd Service's frontend takes the good one's name %s", fe.Name)
			}
		}
	})
}
