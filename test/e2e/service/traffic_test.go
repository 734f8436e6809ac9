package service_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/controller/service"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster"
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
	dep := localcluster.EchoDeployment(ns, "pinned", 2)
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
	for i := range 40 {
		id, err := get(ctx, url)
		if err != nil {
			t.Fatalf("request %d with policy Local: %v", i, err)
		}
		if id.Node != onlyNode.Name {
			t.Fatalf("answered on %s, want %s", id.Node, onlyNode.Name)
		}
	}
}

// No engine keeps the client's address on the way to the backends, Local
// or not; an externalTrafficPolicy Local Service is told so (issue 50 item
// 17), and one annotated lb.ebb.dev/proxy-protocol: v2 hands the address
// to its backends in a PROXY protocol v2 header (the echo reads it).
func TestClientAddressReachesTheBackendsByProxyProtocol(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	deployApp(t, ctx, ns, "web", 2)
	for _, name := range []string{"plain", "proxied"} {
		svc := lbService(ns, name, ebbClass)
		svc.Spec.Selector = map[string]string{"app": "web"}
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		if name == "proxied" {
			svc.Annotations = map[string]string{lbmodel.ProxyProtocolAnnotation: lbmodel.ProxyProtocolV2}
		}
		if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	clientSeen := func(name string) (seen, client string) {
		t.Helper()
		url := "http://" + net.JoinHostPort(waitAddress(t, ctx, ns, name), "80") + "/"
		waitServes(t, ctx, url)
		var local string
		via := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err == nil {
					local = c.LocalAddr().String()
				}
				return c, err
			}}}
		id, err := getVia(ctx, via, url)
		if err != nil {
			t.Fatal(err)
		}
		return id.Client, local
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
	eventually(t, ctx, 30*time.Second, "a "+service.ReasonClientAddressNotPreserved+" event on the Service without it", func(ctx context.Context) (bool, string) {
		return len(serviceEvents(t, ctx, ns, "plain", service.ReasonClientAddressNotPreserved)) > 0, "none yet"
	})
	if evs := serviceEvents(t, ctx, ns, "proxied", service.ReasonClientAddressNotPreserved); len(evs) > 0 {
		t.Errorf("the Service with PROXY protocol was told its client address is lost: %q", evs)
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
		id, err := get(ctx, url)
		first = id.Pod
		return err == nil, fmt.Sprint(err)
	})
	for i := range 30 {
		id, err := get(ctx, url)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if id.Pod != first {
			t.Fatalf("request %d went to %s; session affinity pinned the client to %s", i, id.Pod, first)
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
