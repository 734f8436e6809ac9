package service_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// An LB host cut off the control plane (its traffic still flows) knows
// that its own node's kube-proxy is as blind as it is: a pod that moves
// meanwhile is still where that kube-proxy last saw it. So ebb lb sends no
// new connection of a node-mode Service through its own node port while
// it cannot reach the API server, as long as another node can take them:
// their kube-proxies follow the move (found by bench-faults, issue 45: an
// LB host cut off for 60 s during a drain failed 1,670 requests).
func TestAnLBHostCutOffTheControlPlaneSendsNoNewConnectionThroughItsOwnNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	url := "http://" + exposeApp(t, ctx, ns, "web", 1) + "/"
	waitServes(t, ctx, url)
	var from string
	for _, node := range podNodes(t, ctx, ns, "web") {
		from = node
	}
	// The test's own requests come from the control-plane host, which the
	// cut hides from the LB host: these come through the router, as a
	// user's do.
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cluster.ExternalClient.DialContext}}

	heal, err := cluster.CutFromControlPlane(lbNode.Name)
	if err != nil {
		t.Fatal(err)
	}
	healed := false
	healOnce := func() {
		if healed {
			return
		}
		healed = true
		if err := heal(); err != nil {
			t.Error(err)
			return
		}
		// The next test needs the node Ready (a cut of 40 s makes it
		// NotReady) and ebb lb back to normal.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		eventually(t, ctx, 2*time.Minute, lbNode.Name+" Ready and ebb lb no longer cut off after the cut healed", func(ctx context.Context) (bool, string) {
			n, err := cluster.Client.CoreV1().Nodes().Get(ctx, lbNode.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			ready := localcluster.NodeReady(n)
			cut := slices.Contains(strings.Split(lbMetrics(t), "\n"), "ebb_lb_api_cut_off 1")
			return ready && !cut, fmt.Sprintf("Ready %v, cut off %v", ready, cut)
		})
	}
	t.Cleanup(healOnce)
	// ebb lb counts itself cut off once a report heartbeat (10 s) and a
	// half passed without a report written.
	eventually(t, ctx, time.Minute, "ebb lb on "+lbNode.Name+" counting itself cut off the API server", func(context.Context) (bool, string) {
		page := lbMetrics(t)
		return slices.Contains(strings.Split(page, "\n"), "ebb_lb_api_cut_off 1"), e2eutil.GrepLines(page, "ebb_lb_api_cut_off")
	})

	// The pod moves to another node while the LB host cannot see it.
	setUnschedulable(t, ctx, from, true)
	t.Cleanup(func() { setUnschedulable(t, context.Background(), from, false) })
	if err := cluster.Client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "app=web"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 2*time.Minute, "the pod moved off "+from, func(ctx context.Context) (bool, string) {
		nodes := podNodes(t, ctx, ns, "web")
		for _, n := range nodes {
			if n == from {
				return false, fmt.Sprintf("pods %v", nodes)
			}
		}
		return len(nodes) == 1 && cluster.WaitDeploymentAvailable(ctx, ns, "web", time.Second) == nil, fmt.Sprintf("pods %v", nodes)
	})
	// The app nodes' kube-proxies program the move (waitServes' reason):
	// each app node's node port answers, from the new pod.
	svc, err := cluster.Client.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range appNodes() {
		at := fmt.Sprintf("http://%s:%d/", n.IP, svc.Spec.Ports[0].NodePort)
		eventually(t, ctx, 30*time.Second, n.Name+"'s node port reaching the moved pod", func(ctx context.Context) (bool, string) {
			_, err := getVia(ctx, client, at)
			return err == nil, fmt.Sprint(err)
		})
	}

	before := frontendConnections(t, ns, "web", lbNode.Name)
	failed, first := 0, error(nil)
	const requests = 40
	for range requests {
		if _, err := getVia(ctx, client, url); err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d requests failed while %s was cut off the control plane, after the pod moved; first: %v", failed, requests, lbNode.Name, first)
	}
	if n := frontendConnections(t, ns, "web", lbNode.Name) - before; n > 0 {
		t.Errorf("%v of %d new connections went through %s's own node port while it was cut off", n, requests, lbNode.Name)
	}
	if !adminDown(t, lbNode.Name) {
		t.Errorf("%s's own backends are not admin Down while it is cut off", lbNode.Name)
	}

	healOnce()
	eventually(t, ctx, time.Minute, lbNode.Name+"'s own backends back in service once it reaches the API again", func(context.Context) (bool, string) {
		return !adminDown(t, lbNode.Name), "still Down"
	})
	waitServes(t, ctx, url)
}
