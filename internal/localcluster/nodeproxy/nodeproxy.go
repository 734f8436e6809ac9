// Package nodeproxy makes each simulated node of a local cluster do what
// kube-proxy would: serve every Service's nodePorts on the node's IP and
// forward them to endpoints (externalTrafficPolicy Cluster: any ready
// endpoint; Local: only endpoints on that node, else the connection is
// refused), and serve each Local Service's healthCheckNodePort with
// kube-proxy's answer (200 with localEndpoints > 0, else 503).
package nodeproxy

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/ebbdev/ebb/internal/nodehealth"
)

// kwokNodeAnnotation marks the simulated nodes; only those are proxied.
const kwokNodeAnnotation = "kwok.x-k8s.io/node"

// NodeHealthPort is where each simulated node answers kube-proxy's /healthz.
const NodeHealthPort = nodehealth.KubeProxyPort

// resync re-reconciles periodically so a port that could not be bound is
// retried.
const resync = 10 * time.Second

// Proxy serves the node ports of every simulated node.
type Proxy struct {
	client kubernetes.Interface

	slices  discoverylisters.EndpointSliceLister
	nodes   corelisters.NodeLister
	trigger chan struct{}

	faults *faults

	mu        sync.Mutex
	listeners map[listenKey]listener
}

// New returns a Proxy for the cluster client talks to.
func New(client kubernetes.Interface) *Proxy {
	return &Proxy{client: client, trigger: make(chan struct{}, 1), faults: newFaults(), listeners: map[listenKey]listener{}}
}

// listenKey is one socket: a node IP, a protocol ("TCP", "UDP", "health"
// for a healthCheckNodePort or "nodehealth" for kube-proxy's /healthz) and a
// port.
type listenKey struct {
	ip    string
	proto string
	port  int32
}

// target is what a socket serves; it can change without rebinding.
type target struct {
	namespace, service string
	portName           string
	protocol           corev1.Protocol
	node               string
	local              bool
}

type listener interface {
	setTarget(target)
	close()
}

// Run proxies until ctx is done, then closes every socket.
func (p *Proxy) Run(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("nodeproxy")
	factory := informers.NewSharedInformerFactory(p.client, resync)
	nodes := factory.Core().V1().Nodes()
	services := factory.Core().V1().Services()
	slices := factory.Discovery().V1().EndpointSlices()
	p.slices = slices.Lister()
	p.nodes = nodes.Lister()
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { p.kick() },
		UpdateFunc: func(any, any) { p.kick() },
		DeleteFunc: func(any) { p.kick() },
	}
	for _, inf := range []cache.SharedIndexInformer{nodes.Informer(), services.Informer()} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("watching nodes and services: %w", err)
		}
	}
	_ = slices.Informer() // endpoints are read at connection time
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	defer func() {
		factory.Shutdown()
		p.mu.Lock()
		defer p.mu.Unlock()
		for k, l := range p.listeners {
			l.close()
			delete(p.listeners, k)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.trigger:
		}
		nodeList, err := nodes.Lister().List(labels.Everything())
		if err != nil {
			return fmt.Errorf("listing nodes: %w", err)
		}
		svcList, err := services.Lister().List(labels.Everything())
		if err != nil {
			return fmt.Errorf("listing services: %w", err)
		}
		p.reconcile(log, desired(nodeList, svcList))
	}
}

func (p *Proxy) kick() {
	select {
	case p.trigger <- struct{}{}:
	default:
	}
}

// desired computes every socket the simulated nodes should have.
func desired(nodes []*corev1.Node, services []*corev1.Service) map[listenKey]target {
	want := map[listenKey]target{}
	for _, n := range nodes {
		if n.Annotations[kwokNodeAnnotation] != "fake" || n.DeletionTimestamp != nil {
			continue
		}
		ip := internalIP(n)
		if ip == "" {
			continue
		}
		want[listenKey{ip: ip, proto: "nodehealth", port: NodeHealthPort}] = target{node: n.Name}
		for _, svc := range services {
			if svc.Spec.Type != corev1.ServiceTypeNodePort && svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
				continue
			}
			local := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
			for _, sp := range svc.Spec.Ports {
				if sp.NodePort == 0 {
					continue
				}
				want[listenKey{ip: ip, proto: string(sp.Protocol), port: sp.NodePort}] = target{
					namespace: svc.Namespace, service: svc.Name, portName: sp.Name,
					protocol: sp.Protocol, node: n.Name, local: local,
				}
			}
			if local && svc.Spec.HealthCheckNodePort != 0 {
				want[listenKey{ip: ip, proto: "health", port: svc.Spec.HealthCheckNodePort}] = target{
					namespace: svc.Namespace, service: svc.Name, node: n.Name, local: true,
				}
			}
		}
	}
	return want
}

func internalIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

// reconcile opens, retargets and closes sockets to match want.
func (p *Proxy) reconcile(log logr.Logger, want map[listenKey]target) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, l := range p.listeners {
		if _, ok := want[k]; !ok {
			l.close()
			delete(p.listeners, k)
		}
	}
	for k, t := range want {
		if l, ok := p.listeners[k]; ok {
			l.setTarget(t)
			continue
		}
		addr := net.JoinHostPort(k.ip, strconv.Itoa(int(k.port)))
		var (
			l   listener
			err error
		)
		switch k.proto {
		case "health":
			l, err = listenHealth(addr, t, p.endpointSlices, p.faults)
		case "nodehealth":
			l, err = listenNodeHealth(addr, t, p.nodeHealthy, p.faults)
		case string(corev1.ProtocolUDP):
			l, err = listenUDP(addr, t, p.endpointSlices, p.faults)
		case string(corev1.ProtocolTCP):
			l, err = listenTCP(addr, t, p.endpointSlices, p.faults)
		default:
			continue // SCTP is not simulated
		}
		if err != nil {
			log.Info("Cannot serve node port yet", "address", addr, "protocol", k.proto, "err", err.Error())
			continue
		}
		p.listeners[k] = l
	}
}

// nodeHealthy answers kube-proxy's /healthz question for a node with the
// KEP-3836 rule of internal/nodehealth.
func (p *Proxy) nodeHealthy(name string) bool {
	n, err := p.nodes.Get(name)
	return err == nil && nodehealth.Eligible(n)
}

// endpointSlices lists a Service's EndpointSlices from the cache.
func (p *Proxy) endpointSlices(namespace, service string) []*discoveryv1.EndpointSlice {
	sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: service})
	slices, err := p.slices.EndpointSlices(namespace).List(sel)
	if err != nil {
		return nil
	}
	return slices
}
