package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/appclient"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// lbCluster is the local cluster with ebb installed from dist/install.yaml,
// two LB hosts announcing by BGP to FRR on the router, and an echo
// Service of ebb's class that a client behind the router reaches.
type lbCluster struct {
	c      *localcluster.Cluster
	router *localcluster.BGPRouter
	api    client.Client
	vip    netip.Addr
	// hosts are the two LB hosts; hops their addresses, the route's next
	// hops.
	hosts []localcluster.Node
	hops  []netip.Addr
}

func startLBCluster(ctx context.Context, dist string, realKubelets bool) (*lbCluster, func(), error) {
	c, err := localcluster.Start(ctx, localcluster.Options{Name: "bench-lb-lifecycle", Nodes: 3, Images: []string{filepath.Join(dist, "oci")}, Progress: os.Stderr, RealKubelets: realKubelets})
	if err != nil {
		return nil, nil, err
	}
	lc := &lbCluster{c: c, hosts: c.Nodes[:2]}
	stop := func() {
		if lc.router != nil {
			lc.router.Stop()
		}
		_ = c.Stop()
	}
	if err := lc.setUp(ctx, dist); err != nil {
		stop()
		return nil, nil, err
	}
	return lc, stop, nil
}

func (lc *lbCluster) setUp(ctx context.Context, dist string) error {
	c := lc.c
	bgp := []string{"--bgp-asn", fmt.Sprint(localcluster.LBASN), "--bgp-peer", fmt.Sprintf("%s:%d", localcluster.RouterIP, localcluster.RouterASN), "--bgp-hold-time", "3s"}
	var names []string
	for _, h := range lc.hosts {
		names = append(names, h.Name)
		lc.hops = append(lc.hops, netip.MustParseAddr(h.IP))
	}
	if err := ebbrun.InstallManifest(ctx, c, filepath.Join(dist, "install.yaml"), ebbrun.ManifestOptions{LBNodes: names, LBArgs: bgp}); err != nil {
		return err
	}
	if err := c.DeleteVIPRoutes(); err != nil {
		return err
	}
	var err error
	if lc.router, err = c.StartBGPRouter(ctx, localcluster.BGPRouterOptions{HoldTime: 3 * time.Second}); err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	if lc.api, err = client.New(c.Config, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	// The application does what any application behind kube-proxy must for
	// a pod's eviction not to fail requests (the demo's does too): its
	// preStop sleep keeps it accepting while every node's kube-proxy learns
	// that the endpoint is going. The maintenance of an LB host evicts the
	// application's pods on that host too.
	web := c.GracefulAppDeployment("default", "web", 4)
	if _, err := c.Client.AppsV1().Deployments("default").Create(ctx, web, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := c.WaitDeploymentAvailable(ctx, "default", "web", 2*time.Minute); err != nil {
		return err
	}
	svc := localcluster.EchoService("default", "web", corev1.ServiceTypeLoadBalancer)
	svc.Spec.LoadBalancerClass = ptr.To(lbmodel.ClassL4)
	if _, err := c.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := c.Client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil || len(s.Status.LoadBalancer.Ingress) == 0 {
			return false, nil
		}
		lc.vip, err = netip.ParseAddr(s.Status.LoadBalancer.Ingress[0].IP)
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the Service's address: %w", err)
	}
	if err := lc.waitHops(ctx, lc.hops); err != nil {
		return err
	}
	probe := &loadgen.Requests{URL: lc.url(), Dial: c.ExternalClient.DialContext}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		last = probe.Probe()
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("the client reaching %s (%v): %w", lc.url(), last, err)
	}
	return nil
}

func (lc *lbCluster) url() string { return fmt.Sprintf("http://%s/", lc.vip) }

// waitHops waits until the router's route to the Service's address has
// exactly want as next hops.
func (lc *lbCluster) waitHops(ctx context.Context, want []netip.Addr) error {
	route := netip.PrefixFrom(lc.vip, 32)
	var last []netip.Addr
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		routes, err := lc.router.Routes(ctx)
		if err != nil {
			return false, nil
		}
		last = routes[route]
		return slices.Equal(last, want), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the router's route %s via %v (has %v): %w", route, want, last, err)
	}
	return nil
}

// openLongLived opens n connections from the client behind the router.
func (lc *lbCluster) openLongLived(n int) []*loadgen.LongLived {
	var out []*loadgen.LongLived
	for range n {
		if l, err := appclient.OpenLongLived(lc.c.ExternalClient.DialContext, lc.c.RealKubelets(), netip.AddrPortFrom(lc.vip, 80).String(), 200*time.Millisecond); err == nil {
			out = append(out, l)
		}
	}
	return out
}

// closeLongLived closes the connections and counts the ones that broke
// (or could not be opened: n minus those given); it prints why they broke.
func closeLongLived(open []*loadgen.LongLived, n int) int {
	broken := n - len(open)
	why := map[string]int{}
	if broken > 0 {
		why["could not be opened"] = broken
	}
	for _, l := range open {
		if reason := l.Broken(); reason != "" {
			broken++
			why[reason]++
		}
		l.Close()
	}
	for reason, count := range why {
		fmt.Fprintf(os.Stderr, "  %d long-lived connection(s) broke: %s\n", count, reason)
	}
	return broken
}

// printFailures says when the failed requests were sent, in seconds from
// the start of the load, so that they can be set against the phases the
// bench printed.
func printFailures(reqs *loadgen.Requests) {
	// Spans of failures (a gap of a second or more starts a new one),
	// each with its count.
	var spans []string
	var first, last time.Duration
	n := 0
	flush := func() {
		if n > 0 {
			spans = append(spans, fmt.Sprintf("%.1f-%.1f s (%d)", first.Seconds(), last.Seconds(), n))
		}
	}
	for _, s := range reqs.Samples() {
		if !s.Failed {
			continue
		}
		if n > 0 && s.At-last >= time.Second {
			flush()
			n = 0
		}
		if n == 0 {
			first = s.At
		}
		last = s.At
		n++
	}
	flush()
	if len(spans) > 0 {
		fmt.Fprintf(os.Stderr, "  failed requests sent at: %s\n", strings.Join(spans, ", "))
	}
}

// phase prints a mark on the load's time line.
func phase(reqs *loadgen.Requests, what string) {
	fmt.Fprintf(os.Stderr, "  %.1f s: %s\n", time.Since(reqs.Started()).Seconds(), what)
}

// upgrade rolls the ebb lb DaemonSet once with long long-lived connections
// open through it, and waits until the old pods are gone; it returns the
// broken connections.
func (lc *lbCluster) upgrade(ctx context.Context, reqs *loadgen.Requests, long int) (int, error) {
	old, err := ebbrun.LBPods(ctx, lc.c)
	if err != nil {
		return 0, err
	}
	open := lc.openLongLived(long)
	time.Sleep(time.Second)
	phase(reqs, "rollout restart")
	if err := ebbrun.RolloutRestartLB(ctx, lc.c); err != nil {
		return 0, err
	}
	if err := ebbrun.WaitLBReplaced(ctx, lc.c, old); err != nil {
		return 0, err
	}
	phase(reqs, "a Ready new pod on each LB host")
	time.Sleep(time.Second)
	broken := closeLongLived(open, long)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := ebbrun.LBPods(ctx, lc.c)
		if err != nil {
			return false, nil
		}
		for _, p := range pods {
			if slices.ContainsFunc(old, func(o corev1.Pod) bool { return o.UID == p.UID }) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return broken, fmt.Errorf("waiting for the old ebb lb pods to go: %w", err)
	}
	phase(reqs, "the old pods gone")
	return broken, nil
}

// maintainLBHost runs a NodeMaintenance of the first LB host, Drain to
// Drained to Complete, with long long-lived connections that end 5 s
// into the drain; it returns the broken connections and the time from the
// maintenance's creation to Drained.
func (lc *lbCluster) maintainLBHost(ctx context.Context, reqs *loadgen.Requests, long, run int) (int, time.Duration, error) {
	open := lc.openLongLived(long)
	time.Sleep(time.Second)
	host := lc.hosts[0]
	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-lb-host-%d", run)},
		Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain, Reason: "bench-lb-lifecycle", TrafficDrainTimeoutSeconds: ptr.To[int32](120),
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{host.Name}}}}}}},
	}
	start := time.Now()
	phase(reqs, "NodeMaintenance of "+host.Name+" created")
	if err := lc.api.Create(ctx, nm); err != nil {
		return 0, 0, err
	}
	defer func() { _ = lc.api.Delete(context.Background(), nm) }()
	if err := lc.waitHops(ctx, lc.hops[1:]); err != nil {
		return 0, 0, err
	}
	phase(reqs, "the router's route lost "+host.Name)
	time.Sleep(time.Until(start.Add(5 * time.Second)))
	broken := closeLongLived(open, long)
	// The host's drain message, printed when it changes, says what a slow
	// drain waited for.
	message := ""
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		got := &v1alpha1.NodeMaintenance{}
		if err := lc.api.Get(ctx, client.ObjectKeyFromObject(nm), got); err != nil {
			return false, nil
		}
		for _, ns := range got.Status.NodeStatuses {
			if ns.NodeRef.Name == host.Name && ns.DrainMessage != message {
				message = ns.DrainMessage
				fmt.Fprintf(os.Stderr, "  %5.1f s %s: %s\n", time.Since(start).Seconds(), host.Name, message)
			}
		}
		return meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.DrainedCondition), nil
	})
	if err != nil {
		return broken, 0, fmt.Errorf("waiting for %s's maintenance to be Drained: %w", host.Name, err)
	}
	drained := time.Since(start)
	phase(reqs, "Drained")
	patch := client.MergeFrom(nm.DeepCopy())
	nm.Spec.Stage = v1alpha1.Complete
	if err := lc.api.Patch(ctx, nm, patch); err != nil {
		return broken, drained, err
	}
	if err := lc.waitHops(ctx, lc.hops); err != nil {
		return broken, drained, err
	}
	phase(reqs, "Complete: the route is back to both hosts")
	return broken, drained, nil
}
