// Package lbmodel holds the rules that turn a Service of type LoadBalancer,
// its EndpointSlices and the cluster's Nodes into the frontends and backends
// a load balancer must serve, each backend with its admin state and health
// check. It is pure: no I/O, no clients. The data plane (`ebb lb`) and every
// provider use it, so the rules live only here.
package lbmodel

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	netutils "k8s.io/utils/net"

	"github.com/ebbdev/ebb/internal/dataplane"
)

// Names from DESIGN.md and the KEPs.
const (
	// ClassL4 is ebb's load balancer class (KEP-1959).
	ClassL4 = "ebb.dev/l4"
	// CleanupFinalizer guards a load balancer's resources (KEP-1959).
	CleanupFinalizer = "service.kubernetes.io/load-balancer-cleanup"
	// ServedByAnnotation names the class whose ebb controller serves a
	// Service. The cleanup finalizer is shared with every other
	// implementation, and the apiserver clears the class when a Service
	// stops being a LoadBalancer: this is how a restarted controller tells
	// the Services it must clean up from another implementation's.
	ServedByAnnotation = "lb.ebb.dev/served-by"
	// ExcludeNodeLabel keeps a node out of every load balancer.
	ExcludeNodeLabel = "node.kubernetes.io/exclude-from-external-load-balancers"
	// BackendModeAnnotation set to "pod" sends traffic straight to the
	// endpoints even when the Service has node ports.
	BackendModeAnnotation = "lb.ebb.dev/backend-mode"
	// ProxyProtocolAnnotation set to ProxyProtocolV2 starts each TCP
	// connection to a backend with a PROXY protocol v2 header that carries
	// the client's address: the only way backends learn it, since every
	// engine proxies or masquerades (externalTrafficPolicy: Local included).
	// Only the proxy engine sends it; the kernel engines refuse such a
	// frontend with the reason.
	ProxyProtocolAnnotation = "lb.ebb.dev/proxy-protocol"
	// ProxyProtocolV2 is the one value of ProxyProtocolAnnotation.
	ProxyProtocolV2 = "v2"
	// DefaultNodeHealthPort is kube-proxy's /healthz port (KEP-3836).
	DefaultNodeHealthPort = 10256
)

// Taints that mean a node is leaving by default (DefaultLeavingSignals):
// its backends are admin Down. Cordon (spec.unschedulable) is never one of
// them.
const (
	TaintOutOfService  = "node.kubernetes.io/out-of-service"
	TaintAzureDraining = "cloudprovider.azure.microsoft.com/draining"
	TaintDraining      = "ebb.dev/draining"
	// SpotEvictionValue is the value of TaintAzureDraining that means a
	// spot eviction (seed 000: cloudprovider.azure.microsoft.com/draining=
	// spot-eviction); the key with any other value is not ebb's signal.
	SpotEvictionValue = "spot-eviction"
	// TaintToBeDeleted is the cluster autoscaler's; it counts by default
	// (KEP-3836 fails /healthz on it; counting it here also skips the probe
	// delay) and Options.IgnoreAutoscalerTaint turns that off.
	TaintToBeDeleted = "ToBeDeletedByClusterAutoscaler"
)

// Node event reasons of the admin-state design (seed 000). Down and None
// are reported once per transition by the leader-elected controller;
// UpdateFailed by whichever load balancer could not apply a change (a
// failure is local to it).
const (
	ReasonAdminStateDown         = "LoadBalancerAdminStateDown"
	ReasonAdminStateNone         = "LoadBalancerAdminStateNone"
	ReasonAdminStateUpdateFailed = "LoadBalancerAdminStateUpdateFailed"
)

// The spot preemption signal (seed 000).
const (
	// ReasonPreemptScheduled is the reason of the Event that announces an
	// imminent spot eviction of a node.
	ReasonPreemptScheduled = "PreemptScheduled"
	// SpotHandledAnnotation records on the node the creation time of the
	// newest PreemptScheduled Event acted on: an Event no newer never
	// taints the node again (after a restart, or after an operator
	// cleared the taint), while a newer one does.
	SpotHandledAnnotation = "ebb.dev/spot-eviction-handled"
	// ReasonSpotEvictionTainted is the Node event ebb emits when it adds
	// the spot-eviction taint.
	ReasonSpotEvictionTainted = "SpotEvictionTainted"
)

// Options tune the rules.
type Options struct {
	// NodeHealthPort is probed for externalTrafficPolicy Cluster in node
	// mode. Default DefaultNodeHealthPort.
	NodeHealthPort uint16
	// IgnoreAutoscalerTaint stops ToBeDeletedByClusterAutoscaler counting
	// as leaving.
	IgnoreAutoscalerTaint bool
	// LeavingSignals are the taints and labels that make a node leaving,
	// besides ebb.dev/draining which always does; nil means
	// DefaultLeavingSignals (ParseLeavingSignals reads a configuration).
	LeavingSignals []LeavingSignal
	// AdminStateDisabled leaves every backend's admin state None: only the
	// probes decide (the provider's toggle).
	AdminStateDisabled bool
}

// BackendMode says where a Service's traffic goes.
type BackendMode string

// Backend modes.
const (
	// NodeMode sends traffic to the eligible nodes' InternalIP:nodePort.
	NodeMode BackendMode = "node"
	// PodMode sends traffic straight to the endpoints (KEP-1864).
	PodMode BackendMode = "pod"
)

// ModeOf returns a Service's backend mode: pod mode when it asks for it or
// when a port has no node port, node mode otherwise.
//
// The mode follows the node ports the Service has, not
// allocateLoadBalancerNodePorts: KEP-1864 keeps existing node ports when the
// field turns false, on purpose, so that turning it off breaks no traffic by
// accident. A Service switches to pod mode once its node ports are removed
// (nodePort 0 or left out, in the same update or a later one). The mode is
// per Service, so removing one port's node port moves every port.
func ModeOf(svc *corev1.Service) BackendMode {
	if svc.Annotations[BackendModeAnnotation] == string(PodMode) {
		return PodMode
	}
	for _, p := range svc.Spec.Ports {
		if p.NodePort == 0 {
			return PodMode
		}
	}
	return NodeMode
}

// NodeAdminState is the admin state of every backend on node: Down while the
// node is leaving, None otherwise (and always None when the feature is
// off, or for an unknown node).
func NodeAdminState(node *corev1.Node, opts Options) AdminState {
	if node == nil || opts.AdminStateDisabled {
		return AdminNone
	}
	if leaving, _ := IsLeaving(node, opts); leaving {
		return AdminDown
	}
	return AdminNone
}

// AdminState is a node's admin state on every load balancer, whatever
// engine carries it out (each engine translates: dataplane.AdminState for
// ebb's proxy, the AdminState of Azure's backend entries).
type AdminState string

// Admin states (seed 000's names).
const (
	// AdminNone: in rotation; the probes decide.
	AdminNone AdminState = "None"
	// AdminDown: no new connections; established ones continue.
	AdminDown AdminState = "Down"
)

// EligibleNode reports whether a node may be a backend at all: not being
// deleted and not excluded by label. Cordon does not matter.
func EligibleNode(node *corev1.Node) bool {
	if node.DeletionTimestamp != nil {
		return false
	}
	_, excluded := node.Labels[ExcludeNodeLabel]
	return !excluded
}

// UnsupportedPortError names Service ports the load balancer cannot serve.
type UnsupportedPortError struct{ Ports []string }

func (e *UnsupportedPortError) Error() string {
	return fmt.Sprintf("ports %s use protocol SCTP, which ebb's load balancer does not serve: use TCP or UDP", strings.Join(e.Ports, ", "))
}

// IsUnsupportedPort reports whether err is an UnsupportedPortError.
func IsUnsupportedPort(err error) bool {
	var u *UnsupportedPortError
	return errors.As(err, &u)
}

// Frontends returns the frontends of one Service: one per load-balancer
// address (Addresses: published, or allocated and awaiting an LB host)
// and per TCP or UDP port, sorted by name. Ports it
// cannot serve are left out and reported in an UnsupportedPortError, with
// the frontends of the other ports.
func Frontends(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, nodes []*corev1.Node, opts Options) ([]dataplane.Frontend, error) {
	if opts.NodeHealthPort == 0 {
		opts.NodeHealthPort = DefaultNodeHealthPort
	}
	nodesByName := make(map[string]*corev1.Node, len(nodes))
	for _, n := range nodes {
		nodesByName[n.Name] = n
	}
	var out []dataplane.Frontend
	var unsupported []string
	mode := ModeOf(svc)
	for _, vip := range Addresses(svc) {
		for _, port := range svc.Spec.Ports {
			if port.Protocol != corev1.ProtocolTCP && port.Protocol != corev1.ProtocolUDP && port.Protocol != "" {
				unsupported = appendOnce(unsupported, portName(port))
				continue
			}
			fe := frontendFor(svc, vip, port)
			if mode == NodeMode {
				fe.Backends, fe.HealthCheck = nodeBackends(svc, port, vip, slices, nodes, opts)
			} else {
				fe.Backends, fe.HealthCheck = podBackends(port, vip, slices, nodesByName, opts)
			}
			out = append(out, fe)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	if len(unsupported) > 0 {
		return out, &UnsupportedPortError{Ports: unsupported}
	}
	return out, nil
}

func appendOnce(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

func portName(p corev1.ServicePort) string {
	if p.Name != "" {
		return p.Name
	}
	return strconv.Itoa(int(p.Port))
}

func frontendFor(svc *corev1.Service, vip netip.Addr, port corev1.ServicePort) dataplane.Frontend {
	proto := dataplane.TCP
	if port.Protocol == corev1.ProtocolUDP {
		proto = dataplane.UDP
	}
	fe := dataplane.Frontend{
		Name:         fmt.Sprintf("%s/%s:%s/%s@%s", svc.Namespace, svc.Name, portName(port), proto, vip),
		Address:      vip.String(),
		Port:         uint16(port.Port),
		Protocol:     proto,
		Balancing:    dataplane.RoundRobin,
		SourceRanges: sourceRanges(svc),
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		fe.Balancing = dataplane.ClientIP
	}
	// PROXY protocol v2 over UDP exists but no backend in common use reads
	// it, and the data plane sends it over TCP only.
	fe.ProxyProtocol = proto == dataplane.TCP && svc.Annotations[ProxyProtocolAnnotation] == ProxyProtocolV2
	return fe
}

// sourceRanges are the client ranges a Service admits: the field, or,
// when it is empty, the annotation
// service.beta.kubernetes.io/load-balancer-source-ranges (comma-separated),
// as the cloud providers read them; a Service that relies on the
// annotation would otherwise be open to everyone. Each range is parsed as
// Kubernetes parses a stored object (leading zeros allowed: an API server
// before 1.36 accepted them, and an upgraded cluster keeps them) and
// written in canonical form. A range that does not parse even so is kept
// as written: the data plane refuses the frontend (FrontendNotServed on
// the Service), which fails closed where dropping the range could open the
// Service to every client.
func sourceRanges(svc *corev1.Service) []string {
	ranges := svc.Spec.LoadBalancerSourceRanges
	if len(ranges) == 0 {
		if a := svc.Annotations[corev1.AnnotationLoadBalancerSourceRangesKey]; strings.TrimSpace(a) != "" {
			ranges = strings.Split(a, ",")
		}
	}
	var out []string
	for _, r := range ranges {
		if r = strings.TrimSpace(r); r == "" {
			continue
		}
		if _, ipnet, err := netutils.ParseCIDRSloppy(r); err == nil {
			if p, ok := netipx(ipnet); ok && p.IsValid() {
				r = p.String()
			}
		}
		out = append(out, r)
	}
	return out
}

// netipx is the masked prefix of a parsed CIDR.
func netipx(n *net.IPNet) (netip.Prefix, bool) {
	addr, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	if addr.Is4In6() && ones >= 96 && len(n.Mask) == net.IPv6len {
		ones -= 96
	}
	return netip.PrefixFrom(addr.Unmap(), ones).Masked(), true
}

// nodeBackends: the eligible nodes of the VIP's family, at their
// InternalIP:nodePort. With externalTrafficPolicy Local only nodes with a
// local endpoint, probed on the healthCheckNodePort; with Cluster every
// eligible node, probed on the node health port.
func nodeBackends(svc *corev1.Service, port corev1.ServicePort, vip netip.Addr, slices []*discoveryv1.EndpointSlice, nodes []*corev1.Node, opts Options) ([]dataplane.Backend, *dataplane.HealthCheck) {
	local := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	hc := &dataplane.HealthCheck{Protocol: dataplane.ProbeHTTP, Path: "/healthz", Port: opts.NodeHealthPort}
	var withLocal map[string]bool
	if local {
		hc.Port = uint16(svc.Spec.HealthCheckNodePort)
		withLocal = nodesWithEndpoints(slices, port, vip)
	}
	// Nodes that give one address (DuplicateNodeAddresses) are one
	// backend, the preferred node's: two would make the frontend invalid.
	// preferNode is consulted for duplicates only, so this path costs no
	// more than one pass over the nodes.
	var out []dataplane.Backend
	type kept struct {
		at   int
		node *corev1.Node
	}
	byAddr := map[netip.Addr]kept{}
	for _, n := range nodes {
		if !EligibleNode(n) || (local && !withLocal[n.Name]) {
			continue
		}
		ip, ok := internalIP(n, vip)
		if !ok {
			continue
		}
		b := dataplane.Backend{Address: ip.String(), Port: uint16(port.NodePort), Owner: n.Name, AdminState: dataplane.AdminState(NodeAdminState(n, opts))}
		if k, dup := byAddr[ip]; dup {
			if preferNode(n, k.node) {
				out[k.at], byAddr[ip] = b, kept{k.at, n}
			}
			continue
		}
		byAddr[ip] = kept{len(out), n}
		out = append(out, b)
	}
	sortBackends(out)
	return out, hc
}

// podBackends: the endpoints of the port in the VIP's family, ready ones or,
// when none is ready, serving and terminating ones; each inherits its
// node's admin state and is probed by TCP connect.
func podBackends(port corev1.ServicePort, vip netip.Addr, slices []*discoveryv1.EndpointSlice, nodes map[string]*corev1.Node, opts Options) ([]dataplane.Backend, *dataplane.HealthCheck) {
	var ready, terminating []dataplane.Backend
	seen := map[netip.AddrPort]bool{}
	for _, s := range slices {
		target, ok := slicePort(s, port, vip)
		if !ok {
			continue
		}
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			// An IPv4-mapped address passes the API's IPv4 validation and
			// is the same backend as its IPv4 form to the data plane: as
			// two backends it made the whole frontend invalid.
			addr, ok := parseIP(ep.Addresses[0])
			if !ok || addr.Is4() != vip.Unmap().Is4() || seen[netip.AddrPortFrom(addr, uint16(target))] {
				continue
			}
			seen[netip.AddrPortFrom(addr, uint16(target))] = true
			node := ""
			if ep.NodeName != nil {
				node = *ep.NodeName
			}
			b := dataplane.Backend{Address: addr.String(), Port: uint16(target), Owner: node, AdminState: dataplane.AdminState(NodeAdminState(nodes[node], opts))}
			switch {
			case isTrue(ep.Conditions.Ready, true):
				ready = append(ready, b)
			case isTrue(ep.Conditions.Serving, false) && isTrue(ep.Conditions.Terminating, false):
				terminating = append(terminating, b)
			}
		}
	}
	out := ready
	if len(out) == 0 {
		out = terminating
	}
	sortBackends(out)
	if port.Protocol == corev1.ProtocolUDP {
		// A UDP endpoint cannot be probed generically, and a TCP connect
		// to its port fails unless the pod happens to listen on TCP too:
		// it would take every UDP backend out after two probes. The
		// EndpointSlice's readiness (the pod's own probes) decides, as
		// for kube-proxy.
		return out, nil
	}
	return out, &dataplane.HealthCheck{Protocol: dataplane.ProbeTCP}
}

// nodesWithEndpoints returns the nodes hosting a ready (or, when none is
// ready, serving) endpoint of the port.
func nodesWithEndpoints(slices []*discoveryv1.EndpointSlice, port corev1.ServicePort, vip netip.Addr) map[string]bool {
	ready, serving := map[string]bool{}, map[string]bool{}
	for _, s := range slices {
		if _, ok := slicePort(s, port, vip); !ok {
			continue
		}
		for _, ep := range s.Endpoints {
			if ep.NodeName == nil {
				continue
			}
			if isTrue(ep.Conditions.Ready, true) {
				ready[*ep.NodeName] = true
			} else if isTrue(ep.Conditions.Serving, false) {
				serving[*ep.NodeName] = true
			}
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return serving
}

// slicePort returns the target port of a Service port in a slice of the
// VIP's address family.
func slicePort(s *discoveryv1.EndpointSlice, port corev1.ServicePort, vip netip.Addr) (int32, bool) {
	want := discoveryv1.AddressTypeIPv4
	if vip.Is6() && !vip.Is4In6() {
		want = discoveryv1.AddressTypeIPv6
	}
	if s.AddressType != want {
		return 0, false
	}
	proto := port.Protocol
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	for _, p := range s.Ports {
		name, pProto := "", corev1.ProtocolTCP
		if p.Name != nil {
			name = *p.Name
		}
		if p.Protocol != nil {
			pProto = *p.Protocol
		}
		if name == port.Name && pProto == proto && p.Port != nil {
			return *p.Port, true
		}
	}
	return 0, false
}

// internalIP returns the node's InternalIP of the VIP's family.
func internalIP(n *corev1.Node, vip netip.Addr) (netip.Addr, bool) {
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		// The data plane takes an IPv4-mapped address as IPv4: so must the
		// family check and the duplicate check.
		if ip, ok := parseIP(a.Address); ok && ip.Is4() == vip.Unmap().Is4() {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// parseIP reads an address as Kubernetes reads a stored object (leading
// zeros allowed: API servers before 1.36 accepted them, and an upgraded
// cluster keeps them) and as the data plane keys it (an IPv4-mapped IPv6
// address is its IPv4 address).
func parseIP(s string) (netip.Addr, bool) {
	ip := netutils.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}, false
	}
	addr, ok := netip.AddrFromSlice(ip)
	return addr.Unmap(), ok
}

func isTrue(b *bool, def bool) bool {
	if b == nil {
		return def
	}
	return *b
}

func sortBackends(b []dataplane.Backend) {
	sort.Slice(b, func(i, j int) bool {
		if b[i].Address != b[j].Address {
			return b[i].Address < b[j].Address
		}
		return b[i].Port < b[j].Port
	})
}
