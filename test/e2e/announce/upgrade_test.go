package announce_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/lbsync"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// A rolling upgrade of the ebb lb DaemonSet (`kubectl rollout restart`)
// under traffic from a client behind the router drops nothing: every new
// connection is served, long-lived connections opened before the upgrade
// keep working through it, the router never loses a next hop (each new
// pod takes its host's sockets and BGP session over; graceful restart keeps
// the routes, the new session saying it restarted with its forwarding
// state kept), and each new ebb lb says it took over.
func TestRollingUpgradeDropsNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := e2eutil.DeployBGPService(t, ctx, cluster, router)
	lbA, lbB := s.LBs[0], s.LBs[1]
	vip, route, both, client, url := s.VIP, s.Route, s.NextHops, s.Client, s.URL
	oldPods, err := ebbrun.LBPods(ctx, cluster)
	if err != nil {
		t.Fatal(err)
	}

	requests := e2eutil.StartRequests(t, ctx, client, url, 2)
	long := e2eutil.StartLongLived(t, ctx, cluster, netip.AddrPortFrom(vip, 80), 4)
	routes := e2eutil.WatchRoute(t, ctx, router, route, both)
	time.Sleep(time.Second)

	started := time.Now()
	if err := ebbrun.RolloutRestartLB(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	if err := ebbrun.WaitLBReplaced(ctx, cluster, oldPods); err != nil {
		t.Fatal(err)
	}
	t.Logf("new ebb lb pods ready on both hosts %s after the restart", time.Since(started).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	// The old pods serve the long-lived connections until they end.
	long.Halt()
	if err := ebbrun.WaitLBPodsGone(ctx, cluster, oldPods); err != nil {
		t.Fatal(err)
	}

	time.Sleep(time.Second)
	requests.Halt()
	routes.Halt()

	t.Logf("%d requests on new connections, %d on 4 long-lived connections", requests.OK.Load(), long.OK.Load())
	if n := requests.Failed.Load(); n > 0 {
		t.Errorf("%d of %d requests on new connections failed; first: %v", n, n+requests.OK.Load(), requests.FirstErr.Load())
	}
	if n := long.Failed.Load(); n > 0 {
		t.Errorf("%d of 4 long-lived connections broke; first: %v", n, long.FirstErr.Load())
	}
	if long.OK.Load() == 0 || requests.OK.Load() == 0 {
		t.Error("no traffic went through during the upgrade")
	}
	if n := routes.Failed.Load(); n > 0 {
		t.Errorf("the router lost a next hop of %s %d times during the upgrade; first: %v", route, n, routes.FirstErr.Load())
	}
	e2eutil.ExpectRestartedSessions(t, ctx, router, s.LBs)
	for _, node := range []localcluster.Node{lbA, lbB} {
		page, err := lbPage(ctx, node, "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(page, `ebb_lb_handoffs_total{result="success",role="successor"} 1`) {
			t.Errorf("the new ebb lb on %s did not take over from the old one:\n%s", node.Name, e2eutil.GrepLines(page, "ebb_lb_handoffs_total"))
		}
	}
	// Each hand-off is an Event on the node, as `kubectl get events` shows.
	e2eutil.Eventually(t, ctx, 30*time.Second, "a LoadBalancerTookOver Event on each LB host", func(ctx context.Context) (bool, string) {
		list, err := cluster.Client.EventsV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=" + lbsync.ReasonLoadBalancerTookOver})
		if err != nil {
			return false, err.Error()
		}
		seen := map[string]string{}
		for _, e := range list.Items {
			seen[e.Regarding.Name] = e.Note
		}
		return seen[lbA.Name] != "" && seen[lbB.Name] != "", fmt.Sprint(seen)
	})
}
