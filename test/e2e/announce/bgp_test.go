package announce_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// Two ebb lb replicas announce a Service's address by BGP; FRR installs
// one route with both hosts as next hops, and a client behind the router
// reaches the Service through both. A replica that stops withdraws its
// route at once: the router keeps one next hop and no request fails.
func TestBGPSpreadsFlowsAcrossLBHostsAndAStoppedHostWithdraws(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	lbA, lbB := cluster.Nodes[0], cluster.Nodes[1]
	startLB(t, ctx, lbA)
	stopB := startLB(t, ctx, lbB)

	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vip := e2eutil.DeployLoadBalancedEcho(t, ctx, cluster, ns, "web", 2)
	route := netip.PrefixFrom(vip, 32)
	both := []netip.Addr{netip.MustParseAddr(lbA.IP), netip.MustParseAddr(lbB.IP)}
	waitNextHops(t, ctx, route, both)
	// Each replica's report says what it announces and its session.
	api := e2eutil.APIClient(t, cluster)
	for _, node := range []localcluster.Node{lbA, lbB} {
		e2eutil.Eventually(t, ctx, 10*time.Second, node.Name+"'s report showing its route and session", func(ctx context.Context) (bool, string) {
			r, err := e2eutil.ReportOn(ctx, api, node.Name)
			if err != nil {
				return false, err.Error()
			}
			a := r.Status.Announcement
			ok := a != nil && slices.Contains(a.BGPAnnounced, vip.String()) && len(a.BGPPeers) == 1 &&
				a.BGPPeers[0].Address == localcluster.RouterIP.String() && a.BGPPeers[0].State == "established"
			return ok, fmt.Sprintf("%+v", a)
		})
	}
	// The BGPPeer's status gathers them: both hosts established.
	waitPeerStatus(t, ctx, "router", "2", "2")

	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cluster.ExternalClient.DialContext}}
	url := fmt.Sprintf("http://%s/", vip)
	e2eutil.Eventually(t, ctx, 30*time.Second, "the client reaching "+url, func(ctx context.Context) (bool, string) {
		err := e2eutil.Answered(ctx, cluster, client, url)
		return err == nil, fmt.Sprint(err)
	})
	expectSpread(t, ctx, client, url, lbA, lbB)

	// One host stops being an LB node: its ebb lb pod is stopped, closes
	// its session, and the router withdraws it.
	stopped := time.Now()
	stopB()
	waitNextHops(t, ctx, route, both[:1])
	t.Logf("route withdrawn %s after %s stopped being an LB node", time.Since(stopped).Round(time.Millisecond), lbB.Name)
	waitPeerStatus(t, ctx, "router", "1", "1")
	for i := range 30 {
		if err := e2eutil.Answered(ctx, cluster, client, url); err != nil {
			t.Fatalf("request %d after %s stopped: %v", i, lbB.Name, err)
		}
	}
}

// expectSpread sends 60 requests to url through client, each on a new
// connection: none may fail, and each LB host must carry some (the router
// spreads flows by ECMP).
func expectSpread(t *testing.T, ctx context.Context, client *http.Client, url string, hosts ...localcluster.Node) {
	t.Helper()
	before := map[string]float64{}
	for _, h := range hosts {
		before[h.Name] = lbConnections(t, ctx, h)
	}
	for i := range 60 {
		if err := e2eutil.Answered(ctx, cluster, client, url); err != nil {
			t.Fatalf("request %d from the client to %s: %v", i, url, err)
		}
	}
	for _, h := range hosts {
		if n := lbConnections(t, ctx, h) - before[h.Name]; n == 0 {
			t.Errorf("no connection of 60 to %s went through the LB host %s: the router does not spread flows", url, h.Name)
		} else {
			t.Logf("%s carried %.0f of 60 connections to %s", h.Name, n, url)
		}
	}
}

// waitPeerStatus waits until kubectl get bgppeer shows the peer's
// ESTABLISHED and HOSTS columns as want.
func waitPeerStatus(t *testing.T, ctx context.Context, name, established, hosts string) {
	t.Helper()
	var out []byte
	e2eutil.Eventually(t, ctx, 40*time.Second, fmt.Sprintf("BGPPeer %s showing %s of %s sessions established", name, established, hosts), func(ctx context.Context) (bool, string) {
		var err error
		out, err = exec.CommandContext(ctx, filepath.Join(cluster.BinDir, "kubectl"), "--kubeconfig", cluster.Kubeconfig, "get", "bgppeer", name).CombinedOutput()
		if err != nil {
			return false, fmt.Sprintf("%v: %s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "NAME ") || !strings.Contains(lines[0], "ESTABLISHED") {
			return false, string(out)
		}
		// NAME PEER PEER-ASN MY-ASN ESTABLISHED HOSTS AGE
		f := strings.Fields(lines[1])
		return len(f) == 7 && f[1] == localcluster.RouterIP.String() && f[2] == fmt.Sprint(localcluster.RouterASN) &&
			f[3] == fmt.Sprint(localcluster.LBASN) && f[4] == established && f[5] == hosts, string(out)
	})
	t.Logf("kubectl get bgppeer %s:\n%s", name, out)
}

// waitNextHops waits until the router has installed route via want.
func waitNextHops(t *testing.T, ctx context.Context, route netip.Prefix, want []netip.Addr) {
	t.Helper()
	e2eutil.WaitNextHops(t, ctx, router, route, want)
}

// lbConnections sums the TCP connections an ebb lb has proxied.
func lbConnections(t *testing.T, ctx context.Context, node localcluster.Node) float64 {
	t.Helper()
	page, err := lbPage(ctx, node, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return e2eutil.Sum(page, "ebb_dataplane_connections_total")
}

// A dual-stack Service's IPv6 address goes by MP-BGP over the same IPv4
// sessions: FRR installs a /128 with each LB host's IPv6 address as a next
// hop, the client reaches the Service on its IPv6 address through both
// hosts, and a host that stops withdraws its IPv6 route as it does its
// IPv4 one.
func TestBGPAnnouncesIPv6AddressesOverTheSameSessions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	lbA, lbB := cluster.Nodes[0], cluster.Nodes[1]
	startLB(t, ctx, lbA)
	stopB := startLB(t, ctx, lbB)

	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vips := e2eutil.DeployLoadBalancedEchoService(t, ctx, cluster, ns, "web", 2, func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
	})
	if len(vips) != 2 || !vips[1].Is6() {
		t.Fatalf("a RequireDualStack Service got addresses %v, want an IPv4 and then an IPv6 one", vips)
	}
	v4, v6 := netip.PrefixFrom(vips[0], 32), netip.PrefixFrom(vips[1], 128)
	bothV6 := []netip.Addr{netip.MustParseAddr(lbA.IPv6), netip.MustParseAddr(lbB.IPv6)}
	waitNextHops(t, ctx, v4, []netip.Addr{netip.MustParseAddr(lbA.IP), netip.MustParseAddr(lbB.IP)})
	waitNextHops(t, ctx, v6, bothV6)

	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cluster.ExternalClient.DialContext}}
	url := fmt.Sprintf("http://%s/", net.JoinHostPort(vips[1].String(), "80"))
	e2eutil.Eventually(t, ctx, 30*time.Second, "the client reaching "+url, func(ctx context.Context) (bool, string) {
		err := e2eutil.Answered(ctx, cluster, client, url)
		return err == nil, fmt.Sprint(err)
	})
	expectSpread(t, ctx, client, url, lbA, lbB)

	stopped := time.Now()
	stopB()
	waitNextHops(t, ctx, v6, bothV6[:1])
	t.Logf("IPv6 route withdrawn %s after %s stopped being an LB node", time.Since(stopped).Round(time.Millisecond), lbB.Name)
	for i := range 30 {
		if err := e2eutil.Answered(ctx, cluster, client, url); err != nil {
			t.Fatalf("request %d to %s after %s stopped: %v", i, url, lbB.Name, err)
		}
	}
}
