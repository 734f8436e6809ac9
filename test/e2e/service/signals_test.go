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

	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// Each default leaving signal of the tools that remove nodes (Karpenter's
// disruption taint, medik8s' drain taint) turns the node's backends Down
// on the load balancer and fails the node-agent's /healthz, which a load
// balancer outside the cluster checks; the taint gone, both come back.
// Cordon alone changes neither (issue 49).
func TestDefaultLeavingSignalsOfNodeRemovers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	exposeApp(t, ctx, ns, "removers", 2)
	node := nodeWithPod(t, ctx, ns, "removers")
	waitInRotation(t, ctx, node)

	for _, key := range []string{lbmodel.TaintKarpenterDisrupted, lbmodel.TaintMedik8sDrain} {
		setTaintKey(t, ctx, node, key, "", true)
		eventually(t, ctx, 10*time.Second, key+" to turn "+node+" Down and fail its /healthz", func(context.Context) (bool, string) {
			down, code := adminDown(t, node), agentHealthz(t, node)
			return down && code == http.StatusServiceUnavailable, fmt.Sprintf("Down %v, /healthz %d", down, code)
		})
		setTaintKey(t, ctx, node, key, "", false)
		waitInRotation(t, ctx, node)
	}

	setUnschedulable(t, ctx, node, true)
	defer setUnschedulable(t, context.Background(), node, false)
	time.Sleep(2 * time.Second)
	if down, code := adminDown(t, node), agentHealthz(t, node); down || code != http.StatusOK {
		t.Errorf("cordon alone: backends Down %v, /healthz %d; want in rotation, 200", down, code)
	}
}

// The leaving signals are configuration: the API server refuses a
// malformed list with the line and how to write it (and ebb's own parser
// refuses the same lists); a label added to the list, after the
// components' restart, makes a labelled node leaving for the load
// balancer, the controller's admin-state events and the node-agent alike.
func TestLeavingSignalsConfiguration(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cms := cluster.Client.CoreV1().ConfigMaps(ebbrun.Namespace)
	shipped, err := cms.Get(ctx, leavingSignalsConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setSignals := func(ctx context.Context, text string) error {
		cm, err := cms.Get(ctx, leavingSignalsConfigMap, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cm.Data = map[string]string{"signals": text}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	}

	refused := []struct{ text, message string }{
		{"taint:karpenter.sh/disrupted\nkarpenter.sh/disrupted\n", `leaving signal "karpenter.sh/disrupted" is malformed`},
		{"annotation:example.com/retiring\n", `leaving signal "annotation:example.com/retiring" is malformed`},
		{"label:example.com/retiring=\n", `leaving signal "label:example.com/retiring=" is malformed`},
		{"label:-retiring\n", `leaving signal "label:-retiring" is malformed`},
		{"label:retiring=yes please\n", `leaving signal "label:retiring=yes please" is malformed`},
		{"taint:node.kubernetes.io/unschedulable\n", "cordon alone never makes a node leaving"},
		{"label:" + strings.Repeat("a", 254) + "/retiring\n", "/retiring\" is malformed"},
	}
	for _, r := range refused {
		if _, perr := lbmodel.ParseLeavingSignals(r.text); perr == nil {
			t.Errorf("ebb's parser accepts %q, which the API server's policy refuses", r.text)
		}
		err := setSignals(ctx, r.text)
		if err == nil || !strings.Contains(err.Error(), r.message) {
			t.Errorf("writing %q: %v, want refused with %q", r.text, err, r.message)
		}
	}
	noKey := shipped.DeepCopy()
	noKey.Data = map[string]string{"signal": shipped.Data["signals"]}
	if _, err := cms.Update(ctx, noKey, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "the leaving signals go in data.signals") {
		t.Errorf("writing the list under another key: %v, want refused", err)
	}

	ns := newNamespace(t, ctx)
	exposeApp(t, ctx, ns, "retiring", 2)
	node := nodeWithPod(t, ctx, ns, "retiring")
	waitInRotation(t, ctx, node)

	custom := shipped.Data["signals"] + "  # ours, twice: a repeat is harmless\n  label:example.com/retiring=true\nlabel:example.com/retiring=true\n"
	if _, err := lbmodel.ParseLeavingSignals(custom); err != nil {
		t.Fatalf("ebb's parser refuses what the policy must accept: %v", err)
	}
	if err := setSignals(ctx, custom); err != nil {
		t.Fatalf("writing a valid list: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		if err := setSignals(ctx, shipped.Data["signals"]); err != nil {
			t.Errorf("restoring the shipped leaving signals: %v", err)
			return
		}
		if err := ebbrun.RestartAll(ctx, cluster); err != nil {
			t.Errorf("restarting ebb with the shipped leaving signals: %v", err)
		}
	})
	if err := ebbrun.RestartAll(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	waitInRotation(t, ctx, node)

	downEvents := nodeEvents(t, ctx, node, lbmodel.ReasonAdminStateDown)
	setLabel := func(ctx context.Context, value string) {
		updateNode(t, ctx, node, func(n *corev1.Node) {
			if value == "" {
				delete(n.Labels, "example.com/retiring")
			} else {
				n.Labels["example.com/retiring"] = value
			}
		})
	}
	// Another value is not the signal.
	setLabel(ctx, "later")
	defer setLabel(context.Background(), "")
	time.Sleep(2 * time.Second)
	if down, code := adminDown(t, node), agentHealthz(t, node); down || code != http.StatusOK {
		t.Errorf("label example.com/retiring=later: backends Down %v, /healthz %d; want in rotation, 200", down, code)
	}
	setLabel(ctx, "true")
	eventually(t, ctx, 15*time.Second, "the configured label to make "+node+" leaving", func(ctx context.Context) (bool, string) {
		down, code, events := adminDown(t, node), agentHealthz(t, node), nodeEvents(t, ctx, node, lbmodel.ReasonAdminStateDown)
		return down && code == http.StatusServiceUnavailable && events > downEvents,
			fmt.Sprintf("Down %v, /healthz %d, %d new %s events", down, code, events-downEvents, lbmodel.ReasonAdminStateDown)
	})
	setLabel(ctx, "")
	waitInRotation(t, ctx, node)
}

const leavingSignalsConfigMap = "ebb-leaving-signals"

// waitInRotation waits until a node's backends are in rotation on the
// load balancer and the node-agent answers 200 for it.
func waitInRotation(t *testing.T, ctx context.Context, node string) {
	t.Helper()
	eventually(t, ctx, 30*time.Second, node+" in rotation and healthy", func(context.Context) (bool, string) {
		backends, code := nodeBackends(t, node), agentHealthz(t, node)
		return backends > 0 && code == http.StatusOK, fmt.Sprintf("%d backends in rotation, /healthz %d", backends, code)
	})
}

// agentHealthz is the node-agent's /healthz status code for a node.
func agentHealthz(t *testing.T, node string) int {
	t.Helper()
	return agentStatus(t, node, "/healthz")
}

// agentStatus is the status code of a node-agent's path, on the node's
// address (config/node-agent's --bind-address, in the host network) as a
// load balancer outside the cluster checks it; 0 when it does not answer.
func agentStatus(t *testing.T, node, path string) int {
	t.Helper()
	for _, n := range cluster.Nodes {
		if n.Name != node {
			continue
		}
		client := &http.Client{Timeout: 2 * time.Second}
		resp, err := client.Get("http://" + net.JoinHostPort(n.IP, "10266") + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	t.Fatalf("no node %s in the cluster", node)
	return 0
}
