// Package podserver gives every Running pod of a local cluster a real server
// on its pod IP and container ports, as if its containers were running: on a
// TCP port an HTTP echo that names the pod and node (or a byte-exact TCP echo
// when the client does not speak HTTP), on a UDP port a UDP echo.
//
// Deleting a pod behaves like a graceful shutdown: its listeners close at
// once, or after the containers' preStop sleep if they have one (new
// connections are refused from then on), established connections keep working
// until the pod's deletion timestamp (the end of its grace period), then
// they are closed.
package podserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// resync retries pods whose servers could not start (a port still held).
const resync = 10 * time.Second

// Sockets opens listening sockets on one machine.
type Sockets interface {
	Listen(network, address string) (net.Listener, error)
	ListenPacket(network, address string) (net.PacketConn, error)
}

// localSockets opens sockets in this process's own network.
type localSockets struct{}

func (localSockets) Listen(network, address string) (net.Listener, error) {
	return net.Listen(network, address)
}

func (localSockets) ListenPacket(network, address string) (net.PacketConn, error) {
	return net.ListenPacket(network, address)
}

// Server runs the servers of every pod in a cluster.
type Server struct {
	client kubernetes.Interface
	clock  clock.WithDelayedExecution
	// machine returns the sockets of a node's machine: a pod's servers
	// listen where the pod runs.
	machine func(node string) (Sockets, error)
	// skip leaves pods alone that something else runs (real processes).
	skip func(*corev1.Pod) bool

	mu   sync.Mutex
	pods map[types.UID]*podServer
	// byIP is the servers, running or terminating, that hold each pod IP's
	// sockets. kwok reuses a deleted pod's IP at once, while the old pod's
	// servers may still be in their grace period; a kubelet would have torn
	// down the old sandbox before its IP was reused, so the new pod wins.
	byIP map[string]*podServer
}

// New returns a Server for the cluster client talks to. machine returns
// the sockets of a node's machine (its network namespace); nil serves every
// pod in this process's own network.
func New(client kubernetes.Interface, machine func(node string) (Sockets, error)) *Server {
	if machine == nil {
		machine = func(string) (Sockets, error) { return localSockets{}, nil }
	}
	return &Server{client: client, clock: clock.RealClock{}, machine: machine, pods: map[types.UID]*podServer{}, byIP: map[string]*podServer{}}
}

// Skip leaves the pods for which skip is true to something else (the
// runner of real processes): no servers, no readiness restored.
func (s *Server) Skip(skip func(*corev1.Pod) bool) { s.skip = skip }

// Run serves pods until ctx is done, then closes every server at once.
func (s *Server) Run(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("podserver")
	factory := informers.NewSharedInformerFactory(s.client, resync)
	inf := factory.Core().V1().Pods().Informer()
	nodes := factory.Core().V1().Nodes().Lister()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { s.sync(log, obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) {
			pod := obj.(*corev1.Pod)
			s.sync(log, pod)
			s.restoreReadiness(ctx, log, pod, nodes)
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				s.deleted(pod)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
	s.mu.Lock()
	defer s.mu.Unlock()
	for uid, p := range s.pods {
		p.closeAll()
		delete(s.pods, uid)
	}
	for ip, p := range s.byIP {
		p.closeAll()
		delete(s.byIP, ip)
	}
	return nil
}

// restoreReadiness does what a kubelet does after its node was briefly
// NotReady: the node lifecycle controller marked the node's pods not ready,
// and once the node is Ready again the kubelet reports its running
// containers ready again. kwok does not, so a busy machine whose simulated
// heartbeats lapse would otherwise leave pods unready for good.
func (s *Server) restoreReadiness(ctx context.Context, log logr.Logger, pod *corev1.Pod, nodes corelisters.NodeLister) {
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning || pod.Spec.NodeName == "" || len(pod.Spec.ReadinessGates) > 0 || s.skipped(pod) {
		return
	}
	notReady := false
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionFalse {
			notReady = true
		}
	}
	if !notReady {
		return
	}
	node, err := nodes.Get(pod.Spec.NodeName)
	if err != nil {
		return
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			return
		}
	}
	updated := pod.DeepCopy()
	now := metav1.Now()
	for i, c := range updated.Status.Conditions {
		if c.Type == corev1.PodReady || c.Type == corev1.ContainersReady {
			updated.Status.Conditions[i].Status = corev1.ConditionTrue
			updated.Status.Conditions[i].LastTransitionTime = now
		}
	}
	for i := range updated.Status.ContainerStatuses {
		updated.Status.ContainerStatuses[i].Ready = true
	}
	if _, err := s.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
		log.V(4).Info("Restoring pod readiness", "pod", klog.KObj(pod), "err", err.Error())
	}
}

// sync starts, keeps or begins terminating the servers of one pod.
func (s *Server) sync(log logr.Logger, pod *corev1.Pod) {
	if pod.Spec.HostNetwork || pod.Status.PodIP == "" || pod.Spec.NodeName == "" || s.skipped(pod) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p, running := s.pods[pod.UID]
	switch {
	case pod.DeletionTimestamp != nil:
		if running {
			p.terminate(s.clock, s.clock.Now().Add(preStopSleep(pod)), s.gracefulDeadline(pod))
		}
	// A Pending pod with an IP has its containers starting: serving it
	// from then on, as a container's process listens before its kubelet
	// reports it Running and Ready, keeps a new endpoint from being
	// routed to before anything listens (kwok makes a pod Running and
	// Ready in one step, and kube-proxy may see that first).
	case pod.Status.Phase != corev1.PodRunning && pod.Status.Phase != corev1.PodPending:
		if running {
			p.closeAll()
			delete(s.pods, pod.UID)
		}
	case !running:
		sockets, err := s.machine(pod.Spec.NodeName)
		if err != nil {
			log.Error(err, "Cannot serve pod", "pod", klog.KObj(pod))
			return
		}
		for _, ip := range podIPs(pod) {
			if old, ok := s.byIP[ip]; ok {
				old.closeAll()
			}
		}
		p, err := startPod(pod, sockets)
		if err != nil {
			// Retried on the next resync: the address may still be held by
			// a pod that had the same IP.
			log.Info("Cannot serve pod yet", "pod", klog.KObj(pod), "err", err.Error())
			return
		}
		s.pods[pod.UID] = p
		for _, ip := range podIPs(pod) {
			s.byIP[ip] = p
		}
	}
}

// podIPs are the addresses a pod's servers listen on: one per family on a
// dual-stack node.
func podIPs(pod *corev1.Pod) []string {
	if len(pod.Status.PodIPs) == 0 {
		return []string{pod.Status.PodIP}
	}
	ips := make([]string, 0, len(pod.Status.PodIPs))
	for _, ip := range pod.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	return ips
}

func (s *Server) skipped(pod *corev1.Pod) bool { return s.skip != nil && s.skip(pod) }

// gracefulDeadline is when a deleted pod's containers stop: its grace
// period counted from now, when the deletion is seen, as a kubelet counts it
// (the deletion timestamp has whole seconds only). Without a grace period,
// now.
func (s *Server) gracefulDeadline(pod *corev1.Pod) time.Time {
	now := s.clock.Now()
	if pod.DeletionGracePeriodSeconds == nil {
		return now
	}
	return now.Add(time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second)
}

// preStopSleep is the longest preStop sleep of the pod's containers: a
// kubelet runs it before stopping the container, so the server keeps
// accepting connections meanwhile (how applications ride out the moment
// before every proxy has seen the endpoint go).
func preStopSleep(pod *corev1.Pod) time.Duration {
	var d time.Duration
	for _, c := range pod.Spec.Containers {
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
			d = max(d, time.Duration(c.Lifecycle.PreStop.Sleep.Seconds)*time.Second)
		}
	}
	return d
}

// deleted handles a pod that is gone from the API: its servers finish their
// grace period if one was running, else they close now.
func (s *Server) deleted(pod *corev1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pods[pod.UID]
	if !ok {
		return
	}
	p.terminate(s.clock, s.clock.Now(), s.gracefulDeadline(pod))
	// Forget it now; its timer closes what is left.
	delete(s.pods, pod.UID)
}

// podServer is the running servers of one pod.
type podServer struct {
	listeners []net.Listener
	packets   []net.PacketConn
	https     []*http.Server

	mu          sync.Mutex
	conns       map[net.Conn]struct{}
	terminating bool
	closed      bool
}

func startPod(pod *corev1.Pod, sockets Sockets) (_ *podServer, retErr error) {
	p := &podServer{conns: map[net.Conn]struct{}{}}
	defer func() {
		if retErr != nil {
			p.closeAll()
		}
	}()
	for _, c := range pod.Spec.Containers {
		for _, port := range c.Ports {
			for _, ip := range podIPs(pod) {
				if err := p.listen(sockets, pod, ip, port); err != nil {
					return nil, err
				}
			}
		}
	}
	return p, nil
}

// listen serves one container port of the pod on one of its IPs.
func (p *podServer) listen(sockets Sockets, pod *corev1.Pod, ip string, port corev1.ContainerPort) error {
	addr := net.JoinHostPort(ip, portString(port.ContainerPort))
	id := Identity{Pod: pod.Name, Namespace: pod.Namespace, Node: pod.Spec.NodeName, PodIP: ip, Port: int(port.ContainerPort)}
	switch port.Protocol {
	case corev1.ProtocolUDP:
		pc, err := sockets.ListenPacket("udp", addr)
		if err != nil {
			return fmt.Errorf("listening on udp %s: %w", addr, err)
		}
		p.packets = append(p.packets, pc)
		go serveUDP(pc)
	case corev1.ProtocolTCP, "":
		ln, err := sockets.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listening on tcp %s: %w", addr, err)
		}
		p.listeners = append(p.listeners, ln)
		httpLn := newConnListener(ln.Addr())
		srv := &http.Server{Handler: httpHandler(id), ReadHeaderTimeout: 10 * time.Second}
		p.https = append(p.https, srv)
		go func() { _ = srv.Serve(httpLn) }()
		go p.acceptLoop(ln, httpLn)
	}
	return nil
}

// acceptLoop accepts TCP connections and sends each to the HTTP server or
// to the echo, by what the client sends first.
func (p *podServer) acceptLoop(ln net.Listener, httpLn *connListener) {
	defer httpLn.Close()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if !p.track(conn) {
			_ = conn.Close()
			continue
		}
		go func() {
			br := bufio.NewReader(conn)
			client, err := readProxyHeader(br, conn.RemoteAddr())
			if err != nil {
				p.untrack(conn)
				return
			}
			isHTTPConn, err := isHTTP(br)
			switch {
			case err != nil:
				p.untrack(conn)
			case isHTTPConn:
				if !httpLn.offer(&peekedConn{Conn: conn, r: br, remote: client}) {
					p.untrack(conn)
				}
			default:
				echo(conn, br)
				p.untrack(conn)
			}
		}()
	}
}

// track records an established connection; false once the pod is closed.
func (p *podServer) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *podServer) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

// terminate starts a graceful shutdown: no new connections from stopAccepting
// on (after the preStop hook), the established ones are closed at deadline.
func (p *podServer) terminate(clk clock.WithDelayedExecution, stopAccepting, deadline time.Time) {
	p.mu.Lock()
	if p.terminating || p.closed {
		p.mu.Unlock()
		return
	}
	p.terminating = true
	p.mu.Unlock()
	closeListeners := func() {
		for _, ln := range p.listeners {
			_ = ln.Close()
		}
	}
	if wait := min(stopAccepting.Sub(clk.Now()), deadline.Sub(clk.Now())); wait > 0 {
		clk.AfterFunc(wait, closeListeners)
	} else {
		closeListeners()
	}
	clk.AfterFunc(deadline.Sub(clk.Now()), p.closeAll)
}

// closeAll closes every listener and connection of the pod.
func (p *podServer) closeAll() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, ln := range p.listeners {
		_ = ln.Close()
	}
	for _, pc := range p.packets {
		_ = pc.Close()
	}
	for _, srv := range p.https {
		_ = srv.Close()
	}
	for c := range conns {
		_ = c.Close()
	}
}
