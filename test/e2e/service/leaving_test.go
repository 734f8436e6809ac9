package service_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// One leaving node turns Down on every load balancer at once, whatever the
// Service's shape: node mode with policy Cluster (TCP and UDP), policy
// Local, and pod mode (the pods on that node inherit its state). Every
// request still succeeds, none reaches the node; untainting brings it back.
func TestLeavingNodeAcrossServiceShapes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	deploySpreadApp(t, ctx, ns, "shapes", 3)
	node := nodeWithPod(t, ctx, ns, "shapes")

	shapes := []struct {
		name   string
		mutate func(*corev1.Service)
	}{
		{"cluster", func(*corev1.Service) {}},
		{"local", func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }},
		{"pods", func(s *corev1.Service) { s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false) }},
	}
	addrs := map[string]string{}
	for _, s := range shapes {
		svc := lbService(ns, s.name, ebbClass)
		svc.Spec.Selector = map[string]string{"app": "shapes"}
		s.mutate(svc)
		if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range shapes {
		addrs[s.name] = waitAddress(t, ctx, ns, s.name)
		if err := cluster.WaitServiceEndpoints(ctx, ns, s.name, 3, time.Minute); err != nil {
			t.Fatal(err)
		}
		url := "http://" + net.JoinHostPort(addrs[s.name], "80") + "/"
		eventually(t, ctx, 30*time.Second, "traffic to "+s.name+" through the node", func(ctx context.Context) (bool, string) {
			before := frontendConnections(t, ns, s.name, node)
			for range 10 {
				if _, err := get(ctx, url); err != nil {
					return false, err.Error()
				}
			}
			return frontendConnections(t, ns, s.name, node) > before, "no connection through " + node
		})
	}
	e2eutil.ExpectUDPEcho(t, ctx, net.JoinHostPort(addrs["cluster"], "81"))

	setTaint(t, ctx, node, true)
	defer setTaint(t, context.Background(), node, false)
	eventually(t, ctx, 10*time.Second, "every backend of "+node+" to turn Down", func(context.Context) (bool, string) {
		return adminDown(t, node), "not Down yet"
	})
	for _, s := range shapes {
		before := frontendConnections(t, ns, s.name, node)
		url := "http://" + net.JoinHostPort(addrs[s.name], "80") + "/"
		for i := range 20 {
			if _, err := get(ctx, url); err != nil {
				t.Fatalf("%s: request %d while %s drains: %v\n%s", s.name, i, node, err, lbState(t))
			}
		}
		if got := frontendConnections(t, ns, s.name, node) - before; got != 0 {
			t.Errorf("%s: %.0f new connections went to draining node %s", s.name, got, node)
		}
	}
	// UDP: each new client socket is a new flow.
	before := frontendConnections(t, ns, "cluster", node)
	resent := 0
	for i := range 20 {
		sends, err := udpEcho(net.JoinHostPort(addrs["cluster"], "81"))
		if err != nil {
			t.Fatalf("UDP flow %d while %s drains: %v", i, node, err)
		}
		resent += sends - 1
	}
	t.Logf("20 UDP flows while %s drains answered; %d datagram(s) sent again", node, resent)
	if got := frontendConnections(t, ns, "cluster", node) - before; got != 0 {
		t.Errorf("UDP: %.0f new flows went to draining node %s", got, node)
	}

	setTaint(t, ctx, node, false)
	for _, s := range shapes {
		url := "http://" + net.JoinHostPort(addrs[s.name], "80") + "/"
		eventually(t, ctx, 10*time.Second, s.name+" to send new connections to "+node+" again", func(ctx context.Context) (bool, string) {
			before := frontendConnections(t, ns, s.name, node)
			for range 10 {
				_, _ = get(ctx, url)
			}
			return frontendConnections(t, ns, s.name, node) > before, "none yet"
		})
	}
}

// The admin state lifecycle of seed 000 with the out-of-service taint as
// the trigger: None -> Down when it is added, Down -> None when it goes,
// Down -> Removed when the tainted node is deleted (no request fails), and
// a replacement node with the same name starts in rotation, not Down.
func TestOutOfServiceLifecycleAndNodeReplacement(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	ip := exposeApp(t, ctx, ns, "oos", 3)
	if err := cluster.WaitServiceEndpoints(ctx, ns, "oos", 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	url := "http://" + net.JoinHostPort(ip, "80") + "/"
	apps := appNodes()
	node := apps[len(apps)-1].Name
	requests := func(what string, n int) {
		t.Helper()
		for i := range n {
			if _, err := get(ctx, url); err != nil {
				t.Fatalf("%s: request %d: %v", what, i, err)
			}
		}
	}
	reachesNode := func(what string) {
		t.Helper()
		eventually(t, ctx, 10*time.Second, what, func(ctx context.Context) (bool, string) {
			before := frontendConnections(t, ns, "oos", node)
			for range 10 {
				_, _ = get(ctx, url)
			}
			return frontendConnections(t, ns, "oos", node) > before, "no new connection to " + node
		})
	}
	reachesNode("traffic through " + node)

	// None -> Down. The out-of-service taint is NoExecute, so the pods on
	// the node are evicted too; the Deployment recovers elsewhere.
	oos := corev1.Taint{Key: lbmodel.TaintOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}
	setTaints(t, ctx, node, oos)
	eventually(t, ctx, 10*time.Second, node+" Down after the out-of-service taint", func(context.Context) (bool, string) {
		return adminDown(t, node), "not Down yet"
	})
	// Wait for the evicted pods to be gone: a request racing a pod's
	// termination is kube-proxy's concern, not the load balancer's.
	eventually(t, ctx, time.Minute, "the pods on "+node+" to be evicted", func(ctx context.Context) (bool, string) {
		pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d pods left", len(pods.Items))
	})
	if err := cluster.WaitDeploymentAvailable(ctx, ns, "oos", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitServiceEndpoints(ctx, ns, "oos", 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	before := frontendConnections(t, ns, "oos", node)
	requests("while out of service", 30)
	if got := frontendConnections(t, ns, "oos", node) - before; got != 0 {
		t.Errorf("%.0f new connections went to out-of-service node %s", got, node)
	}

	// Down -> None.
	setTaints(t, ctx, node)
	reachesNode(node + " back in rotation after the taint was removed")

	// Down -> Removed: the tainted node is deleted and comes back under
	// the same name (a reimaged machine).
	setTaints(t, ctx, node, oos)
	eventually(t, ctx, 10*time.Second, node+" Down again", func(context.Context) (bool, string) {
		return adminDown(t, node), "not Down yet"
	})
	stop := make(chan struct{})
	failures := make(chan error, 1)
	go func() {
		defer close(failures)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := get(ctx, url); err != nil {
				failures <- err
				return
			}
		}
	}()
	old, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.Client.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 20*time.Second, "the deleted node's backends to be removed", func(context.Context) (bool, string) {
		n := nodeBackends(t, node)
		return n == 0, fmt.Sprintf("%d backends left", n)
	})
	close(stop)
	if err := <-failures; err != nil {
		t.Errorf("a request failed while the tainted node was removed: %v", err)
	}
	replacement, err := cluster.ReplaceNode(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if replacement.UID == old.UID {
		t.Fatal("the replacement node has the old UID")
	}
	reachesNode("the replacement " + node + " in rotation (it does not inherit Down)")
	if adminDown(t, node) {
		t.Error("the replacement node's backends are Down")
	}
}

// nodeWithPod returns the name of a node that runs one of the app's pods.
func nodeWithPod(t *testing.T, ctx context.Context, ns, app string) string {
	t.Helper()
	pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
			return p.Spec.NodeName
		}
	}
	t.Fatalf("no pod of %s is on a node", app)
	return ""
}

// setTaints replaces a node's taints.
func setTaints(t *testing.T, ctx context.Context, name string, taints ...corev1.Taint) {
	t.Helper()
	updateNode(t, ctx, name, func(n *corev1.Node) { n.Spec.Taints = taints })
}

// frontendConnections sums the connections (UDP: flows) one Service's
// frontends sent to a node's backends.
func frontendConnections(t *testing.T, ns, svc, node string) float64 {
	t.Helper()
	total := 0.0
	for _, l := range strings.Split(lbMetrics(t), "\n") {
		if strings.HasPrefix(l, "ebb_dataplane_connections_total{") && strings.Contains(l, `frontend="`+ns+"/"+svc+":") && strings.Contains(l, `owner="`+node+`"`) {
			v, _ := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
			total += v
		}
	}
	return total
}

// nodeBackends counts the load balancer's backends owned by a node.
func nodeBackends(t *testing.T, node string) int {
	t.Helper()
	n := 0
	for _, l := range strings.Split(lbMetrics(t), "\n") {
		if strings.HasPrefix(l, "ebb_dataplane_backend_admin_state{") && strings.Contains(l, `owner="`+node+`"`) && strings.Contains(l, `state="None"`) {
			n++
		}
	}
	return n
}

// udpEcho opens a new flow (a new client socket) and gets one echo on it.
// Like any UDP client (DNS, say) it sends again, on the same socket and so
// the same flow, when no answer comes within a second: a datagram may be
// lost on any network. It returns how many sends the answer took.
func udpEcho(addr string) (int, error) {
	conn, err := net.Dial("udp", addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	buf := make([]byte, 16)
	for send := 1; ; send++ {
		// agnhost netexec answers "echo <msg>" with <msg>; the simulated
		// nodes' echo sends the datagram back whole.
		if _, err := conn.Write([]byte("echo flow")); err != nil {
			return send, err
		}
		_ = conn.SetReadDeadline(time.Now().Add(time.Second))
		n, err := conn.Read(buf)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && send < 3 {
			continue
		}
		if err != nil {
			return send, fmt.Errorf("no echo after %d sends: %w", send, err)
		}
		if got := strings.TrimSpace(string(buf[:n])); got != "flow" && got != "echo flow" {
			return send, fmt.Errorf("echo %q", buf[:n])
		}
		return send, nil
	}
}
