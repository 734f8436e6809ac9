package service_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// A node tainted ebb.dev/draining gets no new connection from the load
// balancer, while a connection established through it keeps working; removing the taint puts the node back in rotation. Cordon
// alone changes nothing.
func TestDrainingTaintStopsNewConnectionsOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	ip := exposeApp(t, ctx, ns, "drain", 3)
	if err := cluster.WaitServiceEndpoints(ctx, ns, "drain", 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(ip, "80")
	url := "http://" + addr + "/"
	waitServes(t, ctx, url)

	// A long-lived connection through the load balancer that exchanges a
	// message with the app every 100 ms (HTTP keep-alive with agnhost, a
	// raw echo on simulated nodes), through the node the test taints.
	conn, node := openLongLivedThroughANode(t, ns, "drain", addr)
	// echo waits for the next round trip; a broken connection says why.
	echo := func(when string) error {
		before := conn.Echoes()
		for deadline := time.Now().Add(5 * time.Second); conn.Echoes() == before; time.Sleep(50 * time.Millisecond) {
			if broken := conn.Broken(); broken != "" {
				return fmt.Errorf("the connection broke %s: %s", when, broken)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("no echo %s within 5s", when)
			}
		}
		return nil
	}
	if err := echo("before the taint"); err != nil {
		t.Fatal(err)
	}

	// In node mode a pod's answer does not say which node the load
	// balancer chose (the node forwards to any pod), so the load
	// balancer's own per-node connection counter tells.
	downEvents, noneEvents := nodeEvents(t, ctx, node, "LoadBalancerAdminStateDown"), nodeEvents(t, ctx, node, "LoadBalancerAdminStateNone")
	setTaint(t, ctx, node, true)
	// A failure below must not leave the taint to the tests after this
	// one (removing it twice is harmless).
	defer setTaint(t, context.Background(), node, false)
	eventually(t, ctx, 10*time.Second, "the node's backends to turn admin Down", func(context.Context) (bool, string) {
		return adminDown(t, node), "not Down yet"
	})
	if !strings.Contains(lbMetrics(t), `ebb_lb_admin_state_transitions_total{state="Down"}`) {
		t.Error("the admin-state fast path recorded no transition to Down")
	}
	start := frontendConnections(t, ns, "drain", node)
	for i := range 30 {
		if _, err := get(ctx, url); err != nil {
			t.Fatalf("request %d while %s drains: %v\n%s", i, node, err, lbState(t))
		}
	}
	if got := frontendConnections(t, ns, "drain", node) - start; got != 0 {
		t.Errorf("%.0f new connections went to draining node %s", got, node)
	}
	if err := echo("during the drain"); err != nil {
		t.Errorf("the established connection broke when the node was tainted: %v", err)
	}

	eventually(t, ctx, 10*time.Second, "one LoadBalancerAdminStateDown event on the node", func(ctx context.Context) (bool, string) {
		n := nodeEvents(t, ctx, node, "LoadBalancerAdminStateDown")
		return n == downEvents+1, fmt.Sprintf("%d new events", n-downEvents)
	})

	setTaint(t, ctx, node, false)
	eventually(t, ctx, 10*time.Second, "one LoadBalancerAdminStateNone event on the node", func(ctx context.Context) (bool, string) {
		n := nodeEvents(t, ctx, node, "LoadBalancerAdminStateNone")
		return n == noneEvents+1, fmt.Sprintf("%d new events", n-noneEvents)
	})
	eventually(t, ctx, 10*time.Second, "the node to take new connections again", func(ctx context.Context) (bool, string) {
		n := frontendConnections(t, ns, "drain", node)
		for range 10 {
			_, _ = get(ctx, url)
		}
		return frontendConnections(t, ns, "drain", node) > n, "no new connection to the node"
	})

	// Cordon is not a trigger.
	setUnschedulable(t, ctx, node, true)
	defer setUnschedulable(t, context.Background(), node, false)
	time.Sleep(500 * time.Millisecond)
	if adminDown(t, node) {
		t.Error("cordoning the node set its backends Down")
	}
}

// updateNode changes a node as kubectl would, retrying on conflicts (ebb's
// controllers write to nodes too).
func updateNode(t *testing.T, ctx context.Context, name string, change func(*corev1.Node)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(n)
		_, err = cluster.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("updating node %s: %v", name, err)
	}
}

// setTaintKey adds (on) or removes a NoSchedule taint.
func setTaintKey(t *testing.T, ctx context.Context, name, key, value string, on bool) {
	t.Helper()
	updateNode(t, ctx, name, func(n *corev1.Node) {
		var taints []corev1.Taint
		for _, tn := range n.Spec.Taints {
			if tn.Key != key {
				taints = append(taints, tn)
			}
		}
		if on {
			taints = append(taints, corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffectNoSchedule})
		}
		n.Spec.Taints = taints
	})
}

func setTaint(t *testing.T, ctx context.Context, name string, on bool) {
	t.Helper()
	setTaintKey(t, ctx, name, lbmodel.TaintDraining, "maintenance", on)
}

func setUnschedulable(t *testing.T, ctx context.Context, name string, on bool) {
	t.Helper()
	updateNode(t, ctx, name, func(n *corev1.Node) { n.Spec.Unschedulable = on })
}

// openLongLivedThroughANode opens long-lived connections to addr, the
// Service svc's, until the load balancer sends one through a node other
// than the LB node (whose taint would make the LB host itself leave), and
// returns it and that node; the others close when the test ends. The load
// balancer's per-node connection counter tells which node it chose: in
// node mode a pod's answer does not (the node forwards to any pod).
func openLongLivedThroughANode(t *testing.T, ns, svc, addr string) (*loadgen.LongLived, string) {
	t.Helper()
	for range 2 * len(cluster.Nodes) {
		before := map[string]float64{}
		for _, n := range cluster.Nodes {
			before[n.Name] = frontendConnections(t, ns, svc, n.Name)
		}
		conn, err := e2eutil.OpenLongLived(cluster, nil, addr, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		for _, n := range cluster.Nodes {
			if n.Name != lbNode.Name && frontendConnections(t, ns, svc, n.Name) > before[n.Name] {
				t.Logf("the long-lived connection goes through %s", n.Name)
				return conn, n.Name
			}
		}
	}
	t.Fatalf("no long-lived connection to %s went through a node other than the LB node %s", addr, lbNode.Name)
	return nil, ""
}

// lbMetrics scrapes the metrics of the LB node's ebb lb.
func lbMetrics(t *testing.T) string {
	t.Helper()
	page, err := ebbrun.LBPage(context.Background(), cluster, lbNode, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return page
}

// lbState is what the load balancer knew when a request failed: why it
// refused, which backends it took for healthy and in which admin state,
// and the end of its log.
func lbState(t *testing.T) string {
	t.Helper()
	page := lbMetrics(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return strings.Join([]string{
		e2eutil.GrepLines(page, "ebb_dataplane_refused_total{"), e2eutil.GrepLines(page, "ebb_dataplane_probe_up{"),
		e2eutil.GrepLines(page, "ebb_dataplane_backend_admin_state{"), e2eutil.GrepLines(page, "ebb_dataplane_dial_errors_total{"),
		e2eutil.GrepLines(page, "ebb_lb_kernel_state_repairs_total{"), e2eutil.GrepLines(page, "ebb_lb_guard_dropped_packets_total"),
		e2eutil.ComponentLogs(ctx, cluster, "app.kubernetes.io/name=ebb-lb", 40),
	}, "\n")
}

// adminDown reports whether every backend of the node is admin Down.
func adminDown(t *testing.T, node string) bool {
	t.Helper()
	return e2eutil.AdminDown(lbMetrics(t), node)
}

// nodeEvents counts a node's events of one reason, by their series count.
func nodeEvents(t *testing.T, ctx context.Context, node, reason string) int {
	t.Helper()
	list, err := cluster.Client.EventsV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + node + ",reason=" + reason})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range list.Items {
		n++
		if e.Series != nil {
			n += int(e.Series.Count) - 1
		}
	}
	return n
}
