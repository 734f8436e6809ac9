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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/localcluster"
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

// killedLBDropsNothing kills node's ebb lb with SIGKILL (a crash: no
// hand-off, no graceful stop) under traffic on the nftables path: the
// kernel's tables and conntrack go on forwarding every flow, old and new,
// while kubelet restarts it, and the restarted process, finding the
// tables, opens its BGP session as a restart's, so that the router keeps
// the host's routes instead of dropping them at its OPEN.
func killedLBDropsNothing(t *testing.T, ctx context.Context, s e2eutil.BGPService, node localcluster.Node) {
	t.Helper()
	pods, err := ebbrun.LBPods(ctx, cluster)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(pods, func(p corev1.Pod) bool { return p.Spec.NodeName == node.Name && p.DeletionTimestamp == nil })
	if i < 0 {
		t.Fatalf("no ebb lb pod on %s", node.Name)
	}
	pod := pods[i]
	restarts := func(p *corev1.Pod) int32 {
		var n int32
		for _, c := range p.Status.ContainerStatuses {
			n += c.RestartCount
		}
		return n
	}
	before := restarts(&pod)

	resets := e2eutil.WatchResets(t, ctx, cluster)
	requests := e2eutil.StartRequests(t, ctx, s.Client, s.URL, 2)
	long := e2eutil.StartLongLived(t, ctx, cluster, netip.AddrPortFrom(s.VIP, 80), 4)
	routes := e2eutil.WatchRoute(t, ctx, router, s.Route, s.NextHops)
	time.Sleep(time.Second)
	killed := time.Now()
	if n, err := cluster.KillPod(&pod); err != nil || n == 0 {
		t.Fatalf("killing %s: %d processes, %v", pod.Name, n, err)
	}
	e2eutil.Eventually(t, ctx, 2*time.Minute, "the killed ebb lb restarted and ready", func(ctx context.Context) (bool, string) {
		p, err := cluster.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready := slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		})
		return restarts(p) > before && ready, fmt.Sprintf("restarts %d (before %d), ready %v", restarts(p), before, ready)
	})
	t.Logf("the ebb lb killed on %s ready again %s later", node.Name, time.Since(killed).Round(time.Millisecond))
	time.Sleep(3 * time.Second) // its session up again, its routes re-announced
	long.Halt()
	requests.Halt()
	routes.Halt()

	t.Logf("%d requests on new connections, %d on 4 long-lived connections through the kill", requests.OK.Load(), long.OK.Load())
	if n := requests.Failed.Load(); n > 0 {
		t.Errorf("%d of %d requests on new connections failed; first: %v", n, n+requests.OK.Load(), requests.FirstErr.Load())
	}
	if n := long.Failed.Load(); n > 0 {
		t.Errorf("%d of 4 long-lived connections broke; first: %v", n, long.FirstErr.Load())
	}
	if long.Failed.Load() > 0 || requests.Failed.Load() > 0 {
		resets.Log(t, append(long.FailTimes(), requests.FailTimes()...)...)
	}
	if n := routes.Failed.Load(); n > 0 {
		t.Errorf("the router lost a next hop of %s %d times through the kill; first: %v", s.Route, n, routes.FirstErr.Load())
	}
	e2eutil.ExpectRestartedSessions(t, ctx, router, []localcluster.Node{node})
}
