package l2_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// A rolling upgrade of the ebb lb DaemonSet announcing by L2 drops
// nothing: each new pod takes its host's sockets over and speaks for the
// node only once it serves, so the address stays with the same host (the
// router's entry never changes), every request succeeds and long-lived
// connections opened before the upgrade keep working.
func TestL2RollingUpgradeKeepsTheAddressWhereItIs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	lbs := []localcluster.Node{cluster.Nodes[0], cluster.Nodes[1]}
	_, macs := lbHosts(t, ctx, lbs...)
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vip := e2eutil.DeployLoadBalancedEcho(t, ctx, cluster, ns, "web", 1, func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: cluster.Nodes[2].Name}
	})
	url := fmt.Sprintf("http://%s/", vip)
	load := &loadgen.Requests{URL: url, Rate: 100, Dial: cluster.ExternalClient.DialContext}
	e2eutil.Eventually(t, ctx, 30*time.Second, "the client reaching "+url, func(context.Context) (bool, string) {
		err := load.Probe()
		return err == nil, fmt.Sprint(err)
	})
	ownerOf := func() string { return routerOwner(macs, vip) }
	owner := ownerOf()
	if owner == "" {
		t.Fatalf("the router's entry for %s names no LB host", vip)
	}
	oldPods, err := ebbrun.LBPods(ctx, cluster)
	if err != nil {
		t.Fatal(err)
	}

	load.Start()
	var long []*loadgen.LongLived
	for range 4 {
		l, err := e2eutil.OpenLongLived(cluster, cluster.ExternalClient.DialContext, netip.AddrPortFrom(vip, 80).String(), 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		long = append(long, l)
	}
	// The router's entry is watched all along: it must never move.
	moved := make(chan string, 1)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		for watchCtx.Err() == nil {
			if o := ownerOf(); o != "" && o != owner {
				select {
				case moved <- o:
				default:
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	time.Sleep(time.Second)

	if err := ebbrun.RolloutRestartLB(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	if err := ebbrun.WaitLBReplaced(ctx, cluster, oldPods); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	broken := 0
	for _, l := range long {
		if reason := l.Broken(); reason != "" {
			broken++
			t.Logf("a long-lived connection broke: %s", reason)
		}
		l.Close()
	}
	if err := ebbrun.WaitLBPodsGone(ctx, cluster, oldPods); err != nil {
		t.Fatal(err)
	}

	time.Sleep(time.Second)
	load.Stop()
	stopWatch()

	sent, failed := load.Counts()
	t.Logf("%d requests during the upgrade, %d failed; %d of 4 long-lived connections broke", sent, failed, broken)
	if failed > 0 || broken > 0 {
		t.Errorf("%d of %d requests failed (last: %s) and %d of 4 long-lived connections broke", failed, sent, load.LastError(), broken)
	}
	select {
	case o := <-moved:
		t.Errorf("the router moved %s from %s to %s during the upgrade", vip, owner, o)
	default:
	}
	for _, n := range lbs {
		page, err := ebbrun.LBPage(ctx, cluster, n, "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(page, `ebb_lb_handoffs_total{result="success",role="successor"} 1`) {
			t.Errorf("the new ebb lb on %s did not take over from the old one", n.Name)
		}
	}
}
