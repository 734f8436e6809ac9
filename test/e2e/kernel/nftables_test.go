package kernel_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// The kernel engine's other path, nftables (--kernel-path=nftables, what
// --engine=Auto uses by default), serves the Service in the cluster's
// pods too, its UDP port included, and a rolling upgrade under traffic
// drops nothing: the new pod takes the tables over, and conntrack carries
// the connections opened before it. Switching from the eBPF path to it
// (with no traffic) removes the eBPF path's pins.
func TestNftablesPathRollingUpgradeDropsNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := deployService(t, ctx)
	ebpfArgs := setLBArgs(t, ctx, func(args []string) []string {
		return slices.Replace(args, slices.Index(args, "--kernel-path=ebpf"), slices.Index(args, "--kernel-path=ebpf")+1, "--kernel-path=nftables")
	})
	t.Cleanup(func() { setLBArgs(t, context.Background(), func([]string) []string { return ebpfArgs }) })
	for _, n := range s.lbs {
		e2eutil.Eventually(t, ctx, time.Minute, n.Name+"'s ebb lb serving the Service on the nftables path", func(ctx context.Context) (bool, string) {
			page, err := ebbrun.LBPage(ctx, cluster, n, "/metrics")
			engines := e2eutil.GrepLines(page, "ebb_dataplane_frontend_engine{")
			return err == nil && strings.Count(engines, `engine="Kernel",`) == 2 && strings.Count(engines, `path="nftables"`) == 2, fmt.Sprint(engines, err)
		})
	}
	if pins := lbPins(t); len(pins) != 0 {
		t.Errorf("the eBPF path's pins left after the switch to nftables: %v", pins)
	}
	e2eutil.ExpectUDPEcho(t, ctx, net.JoinHostPort(s.vip.String(), "81"))
	oldPods, err := ebbrun.LBPods(ctx, cluster)
	if err != nil {
		t.Fatal(err)
	}

	requests := e2eutil.StartRequests(t, ctx, s.client, s.url, 2)
	long := e2eutil.StartLongLived(t, ctx, cluster, netip.AddrPortFrom(s.vip, 80), 4)
	routes := e2eutil.WatchRoute(t, ctx, router, s.route, s.nextHops)
	time.Sleep(time.Second)
	if err := ebbrun.RolloutRestartLB(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	if err := ebbrun.WaitLBReplaced(ctx, cluster, oldPods); err != nil {
		t.Fatal(err)
	}
	if err := ebbrun.WaitLBPodsGone(ctx, cluster, oldPods); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	long.Halt()
	requests.Halt()
	routes.Halt()
	t.Logf("%d requests on new connections, %d on 4 long-lived connections", requests.OK.Load(), long.OK.Load())
	expectServed(t, requests)
	if n := long.Failed.Load(); n > 0 {
		t.Errorf("%d of 4 long-lived connections broke; first: %v", n, long.FirstErr.Load())
	}
	if long.OK.Load() == 0 || requests.OK.Load() == 0 {
		t.Error("no traffic went through during the upgrade")
	}
	if n := routes.Failed.Load(); n > 0 {
		t.Errorf("the router lost a next hop of %s %d times during the upgrade; first: %v", s.route, n, routes.FirstErr.Load())
	}
}
