package service_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/pires/go-proxyproto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/controller/service"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/appclient"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// externalTrafficPolicy Local sends traffic only to nodes with a local
// endpoint: every request succeeds (a node without one would reset it, as
// its proxy forwards only to its own pods) and is served on that node.
// (Cluster, every eligible node, is TestServiceOfOurClassServesTraffic...)
func TestExternalTrafficPolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	onlyNode := cluster.Nodes[1]
	dep := cluster.AppDeployment(ns, "pinned", 2)
	dep.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: onlyNode.Name}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitDeploymentAvailable(ctx, ns, "pinned", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	svc := lbService(ns, "pinned", ebbClass)
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ip := waitAddress(t, ctx, ns, "pinned")
	if err := cluster.WaitServiceEndpoints(ctx, ns, "pinned", 2, time.Minute); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://%s/", net.JoinHostPort(ip, "80"))
	eventually(t, ctx, 30*time.Second, "traffic with policy Local", func(ctx context.Context) (bool, string) {
		_, err := get(ctx, url)
		return err == nil, fmt.Sprint(err)
	})
	// Every request succeeds: the nodes without a local endpoint are not
	// backends at all, so none is refused.
	onNode := podNodes(t, ctx, ns, "pinned")
	for i := range 40 {
		pod, err := get(ctx, url)
		if err != nil {
			t.Fatalf("request %d with policy Local: %v", i, err)
		}
		if onNode[pod] != onlyNode.Name {
			t.Fatalf("answered by %s on %q, want a pod on %s", pod, onNode[pod], onlyNode.Name)
		}
	}
}

// No engine keeps the client's address on the way to the backends, Local
// or not; an externalTrafficPolicy Local Service is told so (issue 50 item
// 17), and one annotated lb.ebb.dev/proxy-protocol: v2 hands the address
// to its backends in a PROXY protocol v2 header. agnhost reads no such
// header, so the backend is the test's own (clientAddressBackend) on an app
// node's address, behind Services without a selector.
func TestClientAddressReachesTheBackendsByProxyProtocol(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(lbState(t))
		}
	})
	node := appNodes()[0]
	backend := clientAddressBackend(t, node)
	for _, name := range []string{"plain", "proxied"} {
		svc := lbService(ns, name, ebbClass)
		svc.Spec.Selector = nil
		svc.Spec.Ports = svc.Spec.Ports[:1] // http only
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		if name == "proxied" {
			svc.Annotations = map[string]string{lbmodel.ProxyProtocolAnnotation: lbmodel.ProxyProtocolV2}
		}
		if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		createEndpointSlice(t, ctx, ns, name, node, backend)
	}
	clientSeen := func(name string) (seen, client string) {
		t.Helper()
		url := "http://" + net.JoinHostPort(waitAddress(t, ctx, ns, name), "80") + "/"
		via := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		eventually(t, ctx, 30*time.Second, "an answer through "+url, func(ctx context.Context) (bool, string) {
			// The client's address is the one of the connection this
			// request used (a dial given up on may finish later).
			var local string
			trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { local = info.Conn.LocalAddr().String() }}
			body, err := appclient.GetBody(httptrace.WithClientTrace(ctx, trace), via, url)
			seen, client = string(body), local
			return err == nil, fmt.Sprint(err)
		})
		return seen, client
	}
	seen, client := clientSeen("proxied")
	t.Logf("with PROXY protocol v2 the backend saw %s; the client was %s", seen, client)
	if seen != client {
		t.Errorf("with PROXY protocol v2 the backend saw %s, want the client's %s", seen, client)
	}
	seen, client = clientSeen("plain")
	t.Logf("without it the backend saw %s; the client was %s", seen, client)
	if seen == client {
		t.Errorf("without PROXY protocol the backend saw the client's %s: the event and docs say it cannot", client)
	}
	if host, _, err := net.SplitHostPort(seen); err != nil || host != lbNode.IP {
		t.Errorf("without PROXY protocol the backend saw %s, want the LB host's address %s", seen, lbNode.IP)
	}
	eventually(t, ctx, 30*time.Second, "a "+service.ReasonClientAddressNotPreserved+" event on the Service without it", func(ctx context.Context) (bool, string) {
		return len(serviceEvents(t, ctx, ns, "plain", service.ReasonClientAddressNotPreserved)) > 0, "none yet"
	})
	if evs := serviceEvents(t, ctx, ns, "proxied", service.ReasonClientAddressNotPreserved); len(evs) > 0 {
		t.Errorf("the Service with PROXY protocol was told its client address is lost: %q", evs)
	}
}

// clientAddressBackend serves HTTP on node's address (in its network
// namespace) until the test ends, answering each request with the client
// address it saw: the one a PROXY protocol header names when a connection
// starts with one, else the connection's peer. It returns its port.
func clientAddressBackend(t *testing.T, node localcluster.Node) int {
	t.Helper()
	ln, err := node.Host.Listen("tcp", net.JoinHostPort(node.IP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.RemoteAddr)
	})}
	// USE: a header when one comes, else the peer (the library's default
	// since v0.15 is REQUIRE).
	useHeader := func(proxyproto.ConnPolicyOptions) (proxyproto.Policy, error) { return proxyproto.USE, nil }
	go func() {
		_ = srv.Serve(&proxyproto.Listener{Listener: ln, ConnPolicy: useHeader, ReadHeaderTimeout: 5 * time.Second})
	}()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// createEndpointSlice gives the Service ns/name one ready endpoint, node's
// address at port, as an EndpointSlice controller other than Kubernetes'
// would.
func createEndpointSlice(t *testing.T, ctx context.Context, ns, name string, node localcluster.Node, port int) {
	t.Helper()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "e2e.ebb.dev",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{node.IP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(node.Name),
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if _, err := cluster.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TCP and UDP ports on one Service are both served, and session affinity
// keeps a client on one pod (in pod mode the load balancer picks the pod).
func TestTCPAndUDPWithSessionAffinity(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	deployApp(t, ctx, ns, "sticky", 3)
	svc := lbService(ns, "sticky", ebbClass)
	svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ip := waitAddress(t, ctx, ns, "sticky")
	if err := cluster.WaitServiceEndpoints(ctx, ns, "sticky", 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://%s/", net.JoinHostPort(ip, "80"))
	var first string
	eventually(t, ctx, 30*time.Second, "traffic with session affinity", func(ctx context.Context) (bool, string) {
		pod, err := get(ctx, url)
		first = pod
		return err == nil, fmt.Sprint(err)
	})
	for i := range 30 {
		pod, err := get(ctx, url)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if pod != first {
			t.Fatalf("request %d went to %s; session affinity pinned the client to %s", i, pod, first)
		}
	}

	e2eutil.ExpectUDPEcho(t, ctx, net.JoinHostPort(ip, "81"))
	// Still served after the probes would have taken the UDP backends out
	// (two failures 5 s apart): a pod-mode UDP port is not probed with a
	// TCP connect, which a UDP-only pod refuses.
	time.Sleep(12 * time.Second)
	e2eutil.ExpectUDPEcho(t, ctx, net.JoinHostPort(ip, "81"))
}

// Switching a Service between pod mode and node mode at runtime drops no
// request: node ports turned on, then off but kept (node mode stays, as
// KEP-1864 keeps them), then removed.
func TestBackendModeSwitchWithoutDowntime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	deployApp(t, ctx, ns, "switch", 3)
	svc := lbService(ns, "switch", ebbClass)
	svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ip := waitAddress(t, ctx, ns, "switch")
	if err := cluster.WaitServiceEndpoints(ctx, ns, "switch", 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://%s/", net.JoinHostPort(ip, "80"))
	eventually(t, ctx, 30*time.Second, "traffic in pod mode", func(ctx context.Context) (bool, string) {
		_, err := get(ctx, url)
		return err == nil, fmt.Sprint(err)
	})

	// Requests on new connections, all through both switches.
	stop := make(chan struct{})
	done := make(chan struct{})
	var sent, failed int
	var firstErr error
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			sent++
			if _, err := get(ctx, url); err != nil {
				failed++
				if firstErr == nil {
					firstErr = err
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	// setNodePorts sets allocateLoadBalancerNodePorts and, with remove,
	// takes the node ports away, as KEP-1864 asks a user to do: the field
	// alone keeps them.
	setNodePorts := func(on, remove bool) {
		t.Helper()
		cur, err := cluster.Client.CoreV1().Services(ns).Get(ctx, "switch", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.AllocateLoadBalancerNodePorts = ptr.To(on)
		for i := range cur.Spec.Ports {
			if remove {
				cur.Spec.Ports[i].NodePort = 0
			}
		}
		if _, err := cluster.Client.CoreV1().Services(ns).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	nodeBackends := func() bool {
		for _, l := range strings.Split(lbMetrics(t), "\n") {
			if strings.HasPrefix(l, "ebb_dataplane_backend_admin_state{") && strings.Contains(l, `backend="10.0.0.`) && strings.Contains(l, `frontend="`+ns+`/switch:http`) {
				return true
			}
		}
		return false
	}
	time.Sleep(300 * time.Millisecond)
	setNodePorts(true, false)
	eventually(t, ctx, 10*time.Second, "node backends after node ports were turned on", func(context.Context) (bool, string) {
		return nodeBackends(), "still pod backends"
	})
	time.Sleep(500 * time.Millisecond)

	// Turned off, the node ports stay (KEP-1864), and so does node mode;
	// the controller says why.
	setNodePorts(false, false)
	eventually(t, ctx, 30*time.Second, "a "+service.ReasonNodePortsKept+" event", func(ctx context.Context) (bool, string) {
		kept := serviceEvents(t, ctx, ns, "switch", service.ReasonNodePortsKept)
		return len(kept) > 0, "no event yet"
	})
	time.Sleep(2 * time.Second) // what ebb lb did with the same edit
	if !nodeBackends() {
		t.Errorf("turning allocateLoadBalancerNodePorts off with the node ports kept switched to pod mode")
	}

	setNodePorts(false, true)
	eventually(t, ctx, 10*time.Second, "pod backends after the node ports were removed", func(context.Context) (bool, string) {
		return !nodeBackends(), "still node backends"
	})
	time.Sleep(500 * time.Millisecond)
	close(stop)
	<-done
	t.Logf("%d requests across three edits, %d failed", sent, failed)
	if failed != 0 {
		t.Errorf("%d of %d requests failed while switching modes; first: %v", failed, sent, firstErr)
	}
}
