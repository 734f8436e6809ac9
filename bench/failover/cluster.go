package main

import (
	"context"
	"fmt"

	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// The announcement timers: the least hold time FRR accepts, and ebb lb's
// default L2 dead-after time.
const (
	bgpHoldTime = 3 * time.Second
	l2DeadAfter = 500 * time.Millisecond
)

// failoverCluster is the local cluster with ebb installed, two LB hosts
// announcing by one mode, and an echo app on the third node.
type failoverCluster struct {
	c      *localcluster.Cluster
	mode   string
	router *localcluster.BGPRouter
	hosts  []localcluster.Node
	vip    netip.Addr
	// macs names the LB hosts by the MAC of their eth0 (L2 ownership as
	// the router sees it).
	macs map[string]string
}

func startCluster(ctx context.Context, dist, mode string, realKubelets bool) (*failoverCluster, func(), error) {
	c, err := localcluster.Start(ctx, localcluster.Options{Name: "bench-failover-" + mode, Nodes: 3, Images: []string{filepath.Join(dist, "oci")}, Progress: os.Stderr, RealKubelets: realKubelets})
	if err != nil {
		return nil, nil, err
	}
	fc := &failoverCluster{c: c, mode: mode, hosts: c.Nodes[:2], macs: map[string]string{}}
	stop := func() {
		if fc.router != nil {
			fc.router.Stop()
		}
		_ = c.Stop()
	}
	if err := fc.setUp(ctx, dist); err != nil {
		stop()
		return nil, nil, err
	}
	return fc, stop, nil
}

func (fc *failoverCluster) setUp(ctx context.Context, dist string) error {
	c := fc.c
	var args, names []string
	switch fc.mode {
	case "bgp":
		args = []string{"--bgp-asn", fmt.Sprint(localcluster.LBASN), "--bgp-peer", fmt.Sprintf("%s:%d", localcluster.RouterIP, localcluster.RouterASN), "--bgp-hold-time", bgpHoldTime.String()}
	case "l2":
		args = []string{"--l2-interface", "eth0", "--l2-dead-after", l2DeadAfter.String()}
	default:
		return fmt.Errorf("unknown mode %q", fc.mode)
	}
	for _, h := range fc.hosts {
		names = append(names, h.Name)
		mac, err := h.Host.HardwareAddr("eth0")
		if err != nil {
			return err
		}
		fc.macs[mac.String()] = h.Name
	}
	if err := ebbrun.InstallManifest(ctx, c, filepath.Join(dist, "install.yaml"), ebbrun.ManifestOptions{LBNodes: names, LBArgs: args}); err != nil {
		return err
	}
	var err error
	if fc.mode == "bgp" {
		if err := c.DeleteVIPRoutes(); err != nil {
			return err
		}
		if fc.router, err = c.StartBGPRouter(ctx, localcluster.BGPRouterOptions{HoldTime: bgpHoldTime}); err != nil {
			return err
		}
	} else if err := c.RouteVIPsOnLink(); err != nil {
		return err
	}
	// The app runs on the third node only, and its Services keep traffic
	// to that node (externalTrafficPolicy Local): a cut LB host takes no
	// backend with it, so what is measured is the announcement's failover.
	web := c.AppDeployment("default", "web", 2)
	web.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: c.Nodes[2].Name}
	if _, err := c.Client.AppsV1().Deployments("default").Create(ctx, web, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := c.WaitDeploymentAvailable(ctx, "default", "web", 2*time.Minute); err != nil {
		return err
	}
	fc.vip, _, err = fc.createService(ctx, "web", corev1.ServiceExternalTrafficPolicyLocal)
	return err
}

// createService makes a LoadBalancer Service of ebb's class named name in
// front of the web app, and returns its address once a request from the
// client through it succeeds, with how long that took from the create.
func (fc *failoverCluster) createService(ctx context.Context, name string, policy corev1.ServiceExternalTrafficPolicy) (netip.Addr, times, error) {
	c := fc.c
	svc := localcluster.EchoService("default", name, corev1.ServiceTypeLoadBalancer)
	svc.Spec.Selector = map[string]string{"app": "web"}
	svc.Spec.LoadBalancerClass = ptr.To(lbmodel.ClassL4)
	svc.Spec.ExternalTrafficPolicy = policy
	start := time.Now()
	if _, err := c.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return netip.Addr{}, times{}, err
	}
	var vip netip.Addr
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := c.Client.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(s.Status.LoadBalancer.Ingress) == 0 {
			return false, nil
		}
		vip, err = netip.ParseAddr(s.Status.LoadBalancer.Ingress[0].IP)
		return err == nil, nil
	})
	if err != nil {
		return netip.Addr{}, times{}, fmt.Errorf("waiting for Service %s's address: %w", name, err)
	}
	probe := &loadgen.Requests{URL: fmt.Sprintf("http://%s/", vip), Dial: c.ExternalClient.DialContext}
	var last error
	var connected time.Duration
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		last = fc.connect(ctx, vip, 300*time.Millisecond)
		if last == nil {
			if connected == 0 {
				connected = time.Since(start)
			}
			last = probe.Probe()
		}
		return last == nil, nil
	})
	served := time.Since(start)
	if err != nil {
		return netip.Addr{}, times{}, fmt.Errorf("the client reaching %s (%v): %w", vip, last, err)
	}
	return vip, times{reachable: connected, served: served}, nil
}

// times are how long after its create a Service's address was reachable
// from the client (a TCP connection accepted at the address: the
// announcement and the load balancer's listener), and served (an HTTP
// request through it answered by the app: also every node's kube-proxy
// serving the new node port).
type times struct {
	reachable, served time.Duration
}

// timeReachable creates n Services one after another and returns how long
// each address took to be reachable and served from the client. They keep
// the default externalTrafficPolicy (Cluster).
func (fc *failoverCluster) timeReachable(ctx context.Context, n int) ([]times, error) {
	var out []times
	for i := range n {
		_, d, err := fc.createService(ctx, fmt.Sprintf("reach-%d", i), corev1.ServiceExternalTrafficPolicyCluster)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// connect opens and closes one TCP connection from the client to vip:80.
func (fc *failoverCluster) connect(ctx context.Context, vip netip.Addr, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := fc.c.ExternalClient.DialContext(ctx, "tcp", netip.AddrPortFrom(vip, 80).String())
	if err != nil {
		return err
	}
	return conn.Close()
}

// cutResult is one LB host cut off under load.
type cutResult struct {
	host         string
	failover     time.Duration
	sent, failed int64
}

// cutOne cuts one LB host off the network under rate requests per second
// and a prober, waits for the traffic to settle, and plugs it back in.
func (fc *failoverCluster) cutOne(ctx context.Context, run, rate int) (*cutResult, error) {
	if err := fc.waitBoth(ctx); err != nil {
		return nil, err
	}
	host := fc.hosts[run%2].Name
	if fc.mode == "l2" {
		// The owner: cutting the other host would cost nothing. A request
		// first, so that the router has resolved the address lately.
		if err := fc.connect(ctx, fc.vip, time.Second); err != nil {
			return nil, fmt.Errorf("connecting to %s before the cut: %w", fc.vip, err)
		}
		mac, _, err := fc.c.Router.Neighbour(fc.vip)
		if err != nil {
			return nil, err
		}
		if host = fc.macs[mac.String()]; host == "" {
			return nil, fmt.Errorf("the router's neighbour entry for %s is %v, no LB host's MAC", fc.vip, mac)
		}
	}
	load := &loadgen.Requests{URL: fmt.Sprintf("http://%s/", fc.vip), Rate: rate, Dial: fc.c.ExternalClient.DialContext}
	load.Start()
	p := fc.startProber(ctx)
	time.Sleep(2 * time.Second)
	cut := time.Now()
	if err := fc.c.Disconnect(host); err != nil {
		load.Stop()
		p.stop()
		return nil, err
	}
	settle := 5 * time.Second
	if fc.mode == "bgp" {
		settle = bgpHoldTime + 5*time.Second
	}
	time.Sleep(settle)
	load.Stop()
	p.stop()
	if err := fc.c.Reconnect(host); err != nil {
		return nil, err
	}
	sent, failed := load.Counts()
	return &cutResult{host: host, failover: p.recoveredAfter(cut), sent: sent, failed: failed}, nil
}

// waitBoth waits until both LB hosts serve again: both next hops at the
// router (BGP), or both replicas heard by each other for a while (L2).
func (fc *failoverCluster) waitBoth(ctx context.Context) error {
	if fc.mode == "l2" {
		time.Sleep(3 * time.Second)
		return nil
	}
	route := netip.PrefixFrom(fc.vip, 32)
	var want, last []netip.Addr
	for _, h := range fc.hosts {
		want = append(want, netip.MustParseAddr(h.IP))
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		routes, err := fc.router.Routes(ctx)
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

// prober opens a connection to the address every 10 ms (each may take
// 100 ms) and records which succeeded.
type prober struct {
	mu     sync.Mutex
	probes []probe
	done   chan struct{}
	wg     sync.WaitGroup
}

type probe struct {
	at time.Time
	ok bool
}

func (fc *failoverCluster) startProber(ctx context.Context) *prober {
	p := &prober{done: make(chan struct{})}
	tick := time.NewTicker(10 * time.Millisecond)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer tick.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-tick.C:
			}
			p.wg.Add(1)
			go func(at time.Time) {
				defer p.wg.Done()
				err := fc.connect(ctx, fc.vip, 100*time.Millisecond)
				p.mu.Lock()
				p.probes = append(p.probes, probe{at: at, ok: err == nil})
				p.mu.Unlock()
			}(time.Now())
		}
	}()
	return p
}

func (p *prober) stop() {
	close(p.done)
	p.wg.Wait()
}

// recoveredAfter is the time from cut to the first probe that succeeded
// after the last one that failed (0: none failed).
func (p *prober) recoveredAfter(cut time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	probes := slices.Clone(p.probes)
	slices.SortFunc(probes, func(a, b probe) int { return a.at.Compare(b.at) })
	lastFailed := -1
	for i, pr := range probes {
		if !pr.ok {
			lastFailed = i
		}
	}
	if lastFailed < 0 {
		return 0
	}
	for _, pr := range probes[lastFailed+1:] {
		if pr.ok {
			return max(0, pr.at.Sub(cut))
		}
	}
	return probes[len(probes)-1].at.Sub(cut)
}
