package e2eutil

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// WaitNextHops waits until the router's FRR has installed route with want
// as its next hops.
func WaitNextHops(t *testing.T, ctx context.Context, router *localcluster.BGPRouter, route netip.Prefix, want []netip.Addr) {
	t.Helper()
	var last string
	Eventually(t, ctx, 30*time.Second, fmt.Sprintf("FRR installing %s via %v", route, want), func(ctx context.Context) (bool, string) {
		routes, err := router.Routes(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return false, last // the poll's time ran out: keep what was seen
			}
			return false, err.Error()
		}
		last = fmt.Sprintf("routes %v", routes)
		return slices.Equal(routes[route], want), last
	})
}

// WatchRoute checks every 200 ms that the router's route has want as its
// next hops, counting each time it does not, twice in a row 100 ms apart.
// One poll alone is not a lost next hop: FRR's RIB shows the route with no
// installed next hop for a moment while zebra replaces it (when a new
// ebb lb's session re-advertises it after a graceful restart), and its
// detail right after shows every next hop, updated a second ago (seen in
// the flakes of 2026-11-26 03:03 and 07:56, with no request failed). A
// withdrawal lasts as long as the hold time or the withdraw delay.
func WatchRoute(t *testing.T, ctx context.Context, router *localcluster.BGPRouter, route netip.Prefix, want []netip.Addr) *Load {
	l := NewLoad(t)
	// check reads the route's next hops and whether they are want.
	check := func() (got []netip.Addr, ok bool, err error) {
		routes, err := router.Routes(ctx)
		if err != nil {
			return nil, false, err
		}
		return routes[route], slices.Equal(routes[route], want), nil
	}
	l.Go(func() {
		for !l.Stopped() {
			_, ok, err := check()
			if err == nil && !ok {
				time.Sleep(100 * time.Millisecond)
				var got []netip.Addr
				if got, ok, err = check(); err == nil && !ok {
					at := time.Now().Format(time.TimeOnly)
					l.Fail(fmt.Errorf("%s via %v at %s, twice 100 ms apart; FRR's detail right after:\n%s", route, got, at, router.RouteDetail(ctx, route)))
				}
			}
			switch {
			case err != nil:
				l.Fail(err)
			case ok:
				l.OK.Add(1)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	return l
}

// BGPHoldTime is the BGP hold time of the router and the speakers in
// SetUpBGP: the least FRR accepts, so that a vanished host's routes go
// within 3 s.
const BGPHoldTime = 3 * time.Second

// bgpPassword is the TCP MD5 password of the router's sessions: the
// BGPPeer reads it from a Secret.
const bgpPassword = "ebb-e2e-md5"

// routerPeer is the BGPPeer (and its password Secret) by which every LB
// host peers with the router, as a user configures it.
var routerPeer = fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata:
  name: router-bgp-password
  namespace: ebb-system
  labels:
    lb.ebb.dev/bgp-password: "true"   # ebb lb reads only Secrets labeled so
stringData:
  password: %s
---
apiVersion: lb.ebb.dev/v1alpha1
kind: BGPPeer
metadata:
  name: router
spec:
  peerAddress: %s
  peerASN: %d
  myASN: %d
  holdTime: %s
  passwordSecretRef:
    name: router-bgp-password
`, bgpPassword, localcluster.RouterIP, localcluster.RouterASN, localcluster.LBASN, BGPHoldTime)

// SetUpBGP installs ebb from manifest with no LB node yet (tests label
// theirs) and a BGPPeer for the router, removes the router's static route
// to the VIP pool (BGP is the only way there) and starts FRR on the
// router. The caller stops the router.
func SetUpBGP(ctx context.Context, c *localcluster.Cluster, manifest string) (*localcluster.BGPRouter, error) {
	if err := ebbrun.InstallManifest(ctx, c, manifest, ebbrun.ManifestOptions{}); err != nil {
		return nil, err
	}
	if err := ebbrun.ApplyYAML(ctx, c, "bgppeer", routerPeer); err != nil {
		return nil, err
	}
	if err := c.DeleteVIPRoutes(); err != nil {
		return nil, err
	}
	return c.StartBGPRouter(ctx, localcluster.BGPRouterOptions{HoldTime: BGPHoldTime, Password: bgpPassword})
}

// BGPService is a LoadBalancer Service of the cluster's test app behind
// two LB hosts, reached by BGP from the client behind the router.
type BGPService struct {
	// Namespace holds the Service (named web).
	Namespace string
	VIP       netip.Addr
	Route     netip.Prefix
	LBs       []localcluster.Node
	NextHops  []netip.Addr
	// Client is the external client's, one connection per request.
	Client *http.Client
	URL    string
}

// DeployBGPService starts ebb lb on the cluster's first two nodes and a
// two-replica Service of the test app (shaped by shape), waits until both LB hosts
// serve it, the router has both as the address's next hops, and the
// client behind it reaches the Service.
func DeployBGPService(t *testing.T, ctx context.Context, c *localcluster.Cluster, router *localcluster.BGPRouter, shape ...func(*appsv1.Deployment)) BGPService {
	t.Helper()
	s := BGPService{LBs: c.Nodes[:2]}
	WaitEarlierTestsGone(t, ctx, c)
	for _, n := range s.LBs {
		StartLB(t, ctx, c, n)
		s.NextHops = append(s.NextHops, netip.MustParseAddr(n.IP))
	}
	WaitNoLBPodTerminating(t, ctx, c)
	s.Namespace = NewNamespace(t, ctx, c)
	s.VIP = DeployLoadBalancedEcho(t, ctx, c, s.Namespace, "web", 2, shape...)
	s.Route = netip.PrefixFrom(s.VIP, 32)
	// Each LB host serves this Service, not only announces its address:
	// an address an earlier test's Service had may still be announced for
	// that one, whose frontend takes no connection.
	frontend := fmt.Sprintf("frontend=%q", fmt.Sprintf("%s/web:http/TCP@%s", s.Namespace, s.VIP))
	for _, n := range s.LBs {
		Eventually(t, ctx, 30*time.Second, "ebb lb on "+n.Name+" serving "+s.Namespace+"/web", func(ctx context.Context) (bool, string) {
			page, err := ebbrun.LBPage(ctx, c, n, "/metrics")
			engines := GrepLines(page, "ebb_dataplane_frontend_engine{")
			return err == nil && strings.Contains(engines, frontend), fmt.Sprint(engines, err)
		})
	}
	WaitNextHops(t, ctx, router, s.Route, s.NextHops)
	s.Client = &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: c.ExternalClient.DialContext}}
	s.URL = fmt.Sprintf("http://%s/", s.VIP)
	// Through both hosts: 20 requests in a row, each on a connection of
	// its own, which the router spreads by port. One alone proves one
	// host; the other may not have found its backends eligible yet (seen:
	// 9 of 12 connections opened right after were refused).
	Eventually(t, ctx, 30*time.Second, "the client reaching "+s.URL+" 20 times in a row", func(ctx context.Context) (bool, string) {
		for i := range 20 {
			if err := GetOK(ctx, s.Client, s.URL); err != nil {
				return false, fmt.Sprintf("request %d: %v", i, err)
			}
		}
		return true, ""
	})
	return s
}

// WaitEarlierTestsGone waits until the namespaces earlier tests deleted
// are gone, with their Services and pods: an earlier test's Service may
// hold the address the next one's gets, and its pods may still be
// evicted from a node the next test maintains.
func WaitEarlierTestsGone(t *testing.T, ctx context.Context, c *localcluster.Cluster) {
	t.Helper()
	Eventually(t, ctx, 2*time.Minute, "the namespaces of earlier tests gone", func(ctx context.Context) (bool, string) {
		list, err := c.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var terminating []string
		for _, ns := range list.Items {
			if strings.HasPrefix(ns.Name, "e2e-") && ns.DeletionTimestamp != nil {
				terminating = append(terminating, ns.Name)
			}
		}
		return len(terminating) == 0, fmt.Sprintf("terminating: %v", terminating)
	})
}

// WaitNoLBPodTerminating waits until no ebb lb pod is terminating: an
// earlier test's LB node unlabelled at its end stops its pod, which may
// still be draining beside the new one when the next test labels the
// node again.
func WaitNoLBPodTerminating(t *testing.T, ctx context.Context, c *localcluster.Cluster) {
	t.Helper()
	waitNoPodTerminating(t, ctx, c, 2*time.Minute, "no ebb lb pod terminating", ebbrun.Namespace, metav1.ListOptions{LabelSelector: ebbrun.LBPodSelector})
}

// AvoidNode keeps a Deployment's pods off node (a required node affinity).
func AvoidNode(node string) func(*appsv1.Deployment) {
	return func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{node}}}}}}}}
	}
}

// ExpectRestartedSessions checks that the BGP session of each LB host in
// nodes, opened again by the ebb lb that took over there (or restarted
// after a crash, finding the kernel engine's state), said it
// restarted with its forwarding state kept (RFC 4724's Restart State bit
// and IPv4's Forwarding State bit): the router then keeps the host's
// routes until the new speaker's End-of-RIB. Without the bits FRR drops
// them at the OPEN and adds them back at the first UPDATE, and for that
// moment its ECMP sends the host's connections to the other LB hosts,
// which reset them (too short for WatchRoute to see).
func ExpectRestartedSessions(t *testing.T, ctx context.Context, router *localcluster.BGPRouter, nodes []localcluster.Node) {
	t.Helper()
	for _, n := range nodes {
		// The new ebb lb opens its session once it serves, a moment
		// after it is ready.
		var gr localcluster.GracefulRestart
		Eventually(t, ctx, 30*time.Second, n.Name+"'s BGP session up", func(ctx context.Context) (bool, string) {
			var err error
			gr, err = router.GracefulRestartOf(ctx, netip.MustParseAddr(n.IP))
			return err == nil && gr.Established, fmt.Sprint(gr, err)
		})
		if !gr.Restarted || !gr.ForwardingKept["ipv4Unicast"] {
			t.Errorf("%s's BGP session, opened again by its new ebb lb: restarted %v, forwarding kept %v; want a restart with IPv4's forwarding kept", n.Name, gr.Restarted, gr.ForwardingKept)
		}
	}
}
