package kernel_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// The kernel engine's other path, nftables (--kernel-path=nftables, what
// --engine=Auto uses by default), serves the Service in the cluster's
// pods, its UDP port too, where every LB host is also a node, and so a
// backend of its own: a new flow to the host's own node port is left for
// kube-proxy to translate on to a pod (before, ebb translated it to the
// node port, kube-proxy's translation never applied, and a third of new
// connections were refused). A rolling upgrade under traffic drops
// nothing: the new pod takes the tables over, and conntrack carries the
// connections opened before it. So does an ebb lb killed with SIGKILL.
// Switching from the eBPF path to it removes the eBPF path's pins.
func TestNftablesPathServesTheLBHostsOwnNodePortAndUpgradesDroppingNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := deployService(t, ctx)
	ebpfArgs := setLBArgs(t, ctx, func(args []string) []string {
		at := slices.Index(args, "--kernel-path=ebpf")
		return slices.Replace(args, at, at+1, "--kernel-path=nftables")
	})
	t.Cleanup(func() { setLBArgs(t, context.Background(), func([]string) []string { return ebpfArgs }) })
	for _, n := range s.LBs {
		e2eutil.Eventually(t, ctx, time.Minute, n.Name+"'s ebb lb serving both of the Service's ports on the nftables path", func(ctx context.Context) (bool, string) {
			page, err := ebbrun.LBPage(ctx, cluster, n, "/metrics")
			engines := e2eutil.GrepLines(e2eutil.GrepLines(page, "ebb_dataplane_frontend_engine{"), `frontend="`+s.Namespace+"/")
			return err == nil && strings.Count(engines, `engine="Kernel",`) == 2 && strings.Count(engines, `path="nftables"`) == 2, fmt.Sprint(engines, err)
		})
	}
	if pins := lbPins(t); len(pins) != 0 {
		t.Errorf("the eBPF path's pins left after the switch to nftables: %v", pins)
	}
	e2eutil.ExpectUDPEchoVia(t, ctx, cluster.ExternalClient.DialContext, net.JoinHostPort(s.VIP.String(), "81"))
	// Every request on its own connection (the router spreads them by
	// port): a third of them have the LB host's own node port as their
	// backend.
	first := e2eutil.StartRequests(t, ctx, s.Client, s.URL, 2)
	time.Sleep(3 * time.Second)
	first.Halt()
	t.Logf("%d requests on new connections before the upgrade", first.OK.Load())
	expectServed(t, first)

	rollingUpgradeDropsNothing(t, ctx, s)
	e2eutil.ExpectUDPEchoVia(t, ctx, cluster.ExternalClient.DialContext, net.JoinHostPort(s.VIP.String(), "81"))
	killedLBDropsNothing(t, ctx, s, s.LBs[0])
}
