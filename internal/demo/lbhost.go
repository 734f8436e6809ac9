package demo

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// LBHostResult is what clients noticed while a host of the load balancer
// itself was maintained.
type LBHostResult struct {
	// Host is the LB host maintained; Other took its address over.
	Host, Other    string
	RequestsSent   int64
	RequestsFailed int64
	// LongLived connections were open through the host when its
	// maintenance started; LongLivedBroken of them broke.
	LongLived, LongLivedBroken int64
	// TakeoverMs is from the maintenance's start to the router sending
	// the address to the other LB host.
	TakeoverMs float64
	// DrainedSeconds is from the maintenance's start to Drained: the
	// host's own connections gone.
	DrainedSeconds float64
}

// lbHostMetrics is where the installed ebb lb serves /readyz, on each LB
// host's loopback (config/lb).
const lbHostMetrics = "127.0.0.1:9464"

// l2Policy turns L2 announcement on for every address, on the LB hosts'
// eth0 (the node network), as a user does with no change to ebb lb.
const l2Policy = `apiVersion: lb.ebb.dev/v1alpha1
kind: AnnouncementPolicy
metadata:
  name: demo-l2
spec:
  l2:
    interfaces: [eth0]
`

// RunLBHost maintains a host of the load balancer under traffic. ebb is
// installed (dist/install.yaml) with ebb lb on the first node; the second
// becomes an LB node too, an AnnouncementPolicy announces the addresses by
// L2 on the node network (the router reaches the address pool on link), a
// client behind the router sends requests and keeps connections open, and
// a NodeMaintenance drains the host that owns the Service's address: its
// ebb lb hands the address to the other, serves its established
// connections, and the maintenance is Drained when they are gone. The app
// runs on the third node. The router's routes are put back at the end.
func RunLBHost(ctx context.Context, c *localcluster.Cluster, progress io.Writer) (*LBHostResult, error) {
	if len(c.Nodes) < 3 {
		return nil, fmt.Errorf("maintaining an LB host needs 3 nodes (two LB hosts and one for the app), the cluster has %d", len(c.Nodes))
	}
	step := func(format string, args ...any) { fmt.Fprintf(progress, "[demo] lb host: "+format+"\n", args...) }
	hosts, appNode := c.Nodes[:2], c.Nodes[2]
	step("ebb lb on %s and %s (label %s), announcing by ARP on eth0 (AnnouncementPolicy demo-l2); the router reaches the pool on link",
		hosts[0].Name, hosts[1].Name, ebbrun.LBNodeLabel)
	for _, h := range hosts {
		if err := ebbrun.SetLBNode(ctx, c, h.Name, true); err != nil {
			return nil, err
		}
	}
	if err := ebbrun.ApplyYAML(ctx, c, "demo-l2", l2Policy); err != nil {
		return nil, err
	}
	for _, h := range hosts {
		if err := waitFor(ctx, time.Minute, func() bool { return lbHostReady(ctx, &h) }); err != nil {
			return nil, fmt.Errorf("ebb lb on %s not ready (logs in %s/logs/pods): %w", h.Name, c.Dir(), err)
		}
	}
	if err := c.RouteVIPsOnLink(); err != nil {
		return nil, err
	}
	defer func() { _ = c.RouteVIPs() }()

	ns := "demo-lbhost"
	app := appKindOf(c)
	vip, err := deployPinned(ctx, c, ns, appNode.Name)
	if err != nil {
		return nil, err
	}
	url := fmt.Sprintf("http://%s%s", vip, app.path())
	probe := &loadgen.Requests{URL: url, Dial: c.ExternalClient.DialContext}
	if err := waitFor(ctx, time.Minute, func() bool { return probe.Probe() == nil }); err != nil {
		return nil, fmt.Errorf("the client reaching %s through the LB hosts: %w", url, err)
	}
	owner := func() string {
		mac, _, err := c.Router.Neighbour(vip)
		if err != nil || mac == nil {
			return ""
		}
		for _, h := range hosts {
			if m, err := h.Host.HardwareAddr("eth0"); err == nil && m.String() == mac.String() {
				return h.Name
			}
		}
		return ""
	}
	res := &LBHostResult{Host: owner()}
	if res.Host == "" {
		return nil, fmt.Errorf("the router's neighbour entry for %s names no LB host", vip)
	}
	for _, h := range hosts {
		if h.Name != res.Host {
			res.Other = h.Name
		}
	}
	step("%s owns %s; 100 requests/s and 4 long-lived connections from the client", res.Host, vip)
	load := &loadgen.Requests{URL: url, Rate: 100, Dial: c.ExternalClient.DialContext, Serving: app.serving()}
	load.Start()
	var long []*loadgen.LongLived
	for range 4 {
		l, err := app.openLongLived(c.ExternalClient.DialContext, netip.AddrPortFrom(vip, 80).String(), 200*time.Millisecond)
		if err != nil {
			load.Stop()
			return nil, fmt.Errorf("opening a long-lived connection: %w", err)
		}
		long = append(long, l)
	}
	sleep(ctx, 2*time.Second)

	cl, err := newClient(c)
	if err != nil {
		load.Stop()
		return nil, err
	}
	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "demo-lb-host-"},
		Spec: v1alpha1.NodeMaintenanceSpec{
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{res.Host}}}}}},
			Stage: v1alpha1.Drain, Reason: "ebb demo: maintenance of the LB host " + res.Host, TrafficDrainTimeoutSeconds: ptr.To[int32](60),
		},
	}
	start := time.Now()
	if err := cl.Create(ctx, nm); err != nil {
		load.Stop()
		return nil, fmt.Errorf("creating the NodeMaintenance: %w", err)
	}
	step("NodeMaintenance %s in stage Drain on %s", nm.Name, res.Host)
	if err := waitFor(ctx, 30*time.Second, func() bool { return owner() == res.Other }); err != nil {
		load.Stop()
		return nil, fmt.Errorf("the router moving %s to %s: %w", vip, res.Other, err)
	}
	res.TakeoverMs = float64(time.Since(start).Microseconds()) / 1000
	step("%s took %s over after %.0f ms; %s serves its established connections", res.Other, vip, res.TakeoverMs, res.Host)
	// The clients finish their long-lived connections, as clients do;
	// the maintenance waits for them.
	sleep(ctx, 3*time.Second)
	for _, l := range long {
		if l.Broken() != "" {
			res.LongLivedBroken++
		}
		l.Close()
	}
	res.LongLived = int64(len(long))
	if err := waitFor(ctx, time.Minute, func() bool {
		got := &v1alpha1.NodeMaintenance{}
		return cl.Get(ctx, client.ObjectKeyFromObject(nm), got) == nil && meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.DrainedCondition)
	}); err != nil {
		load.Stop()
		return nil, fmt.Errorf("waiting for %s to be Drained: %w", res.Host, err)
	}
	res.DrainedSeconds = time.Since(start).Seconds()
	step("%s drained in %.1f s (its own connections gone); completing the maintenance", res.Host, res.DrainedSeconds)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &v1alpha1.NodeMaintenance{}
		if err := cl.Get(ctx, client.ObjectKeyFromObject(nm), cur); err != nil {
			return err
		}
		cur.Spec.Stage = v1alpha1.Complete
		return cl.Update(ctx, cur)
	})
	sleep(ctx, 2*time.Second)
	load.Stop()
	res.RequestsSent, res.RequestsFailed = load.Counts()
	if err != nil {
		return nil, fmt.Errorf("completing the maintenance: %w", err)
	}
	return res, nil
}

// deployPinned deploys the echo app (2 replicas) on one node behind a
// LoadBalancer Service of ebb's class and returns its address.
func deployPinned(ctx context.Context, c *localcluster.Cluster, ns, node string) (netip.Addr, error) {
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return netip.Addr{}, err
	}
	dep := c.GracefulAppDeployment(ns, "web", 2)
	dep.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	if err := createAndWait(ctx, c, dep); err != nil {
		return netip.Addr{}, err
	}
	svc := localcluster.EchoService(ns, "web", corev1.ServiceTypeLoadBalancer)
	svc.Spec.LoadBalancerClass = ptr.To(lbmodel.ClassL4)
	if _, err := c.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return netip.Addr{}, err
	}
	var vip netip.Addr
	err := waitFor(ctx, time.Minute, func() bool {
		s, err := c.Client.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil || len(s.Status.LoadBalancer.Ingress) == 0 {
			return false
		}
		vip, err = netip.ParseAddr(s.Status.LoadBalancer.Ingress[0].IP)
		return err == nil
	})
	return vip, err
}

func createAndWait(ctx context.Context, c *localcluster.Cluster, dep *appsv1.Deployment) error {
	if _, err := c.Client.AppsV1().Deployments(dep.Namespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return err
	}
	return c.WaitDeploymentAvailable(ctx, dep.Namespace, dep.Name, 2*time.Minute)
}

// waitFor polls cond every 50 ms until it holds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !cond() {
		if ctx.Err() != nil {
			return fmt.Errorf("not within %s", timeout)
		}
		sleep(ctx, 50*time.Millisecond)
	}
	return nil
}

// lbHostReady reports whether the ebb lb on host answers /readyz.
func lbHostReady(ctx context.Context, h *localcluster.Node) bool {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return h.Host.DialContext(ctx, network, lbHostMetrics)
	}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+lbHostMetrics+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
