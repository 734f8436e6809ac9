package announce_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/internal/addrrange"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/internal/localcluster/network"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// An AnnouncementPolicy's communities and large communities reach the
// router (FRR) on the route; its local preference does only over iBGP
// (RFC 4271 keeps it off eBGP sessions), so the router's peer group and
// the BGPPeer turn iBGP for the second half.
func TestAnnouncementPolicyAttributesReachTheRouter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	_, vip, hop := webBehindOneLBHost(t, ctx)
	route := netip.PrefixFrom(vip, 32)

	api := e2eutil.APIClient(t, cluster)
	policy := &lbv1alpha1.AnnouncementPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "tagged"},
		Spec: lbv1alpha1.AnnouncementPolicySpec{AddressPools: []string{ebbrun.DefaultPoolName}, BGP: &lbv1alpha1.BGPAnnouncement{
			Communities:      []string{"64512:100", "no-export"},
			LargeCommunities: []string{"4200000000:1:2"},
			LocalPreference:  ptrTo[int64](250),
		}},
	}
	if err := api.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	// A policy left behind would announce the default pool its way in
	// the suite's later tests.
	t.Cleanup(func() {
		if err := api.Delete(context.Background(), policy); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting AnnouncementPolicy %s: %v", policy.Name, err)
		}
	})
	waitPath(t, ctx, route, hop, []string{"64512:100", "no-export"}, []string{"4200000000:1:2"}, func(lp *uint32) bool { return lp == nil || *lp != 250 })

	// A new community replaces the route's, without the route going.
	routes := e2eutil.WatchRoute(t, ctx, router, route, []netip.Addr{hop})
	before := policy.DeepCopy()
	policy.Spec.BGP.Communities = []string{"64512:200"}
	if err := api.Patch(ctx, policy, ctrlclient.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	waitPath(t, ctx, route, hop, []string{"64512:200"}, []string{"4200000000:1:2"}, func(lp *uint32) bool { return lp == nil || *lp != 250 })
	routes.Halt()
	if n := routes.Failed.Load(); n > 0 {
		t.Errorf("the router lost the route while its community changed (%d times; first: %v)", n, routes.FirstErr.Load())
	}

	// iBGP: the router's peer group and the BGPPeer's own AS number.
	// The clean-up, registered first, puts both back even if one half
	// failed: the suite's later tests peer by eBGP.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, err := range setIBGP(ctx, api, false) {
			t.Errorf("back to eBGP: %v", err)
		}
		waitNextHops(t, ctx, route, []netip.Addr{hop})
	})
	for _, err := range setIBGP(ctx, api, true) {
		t.Fatalf("to iBGP: %v", err)
	}
	waitPath(t, ctx, route, hop, []string{"64512:200"}, []string{"4200000000:1:2"}, func(lp *uint32) bool { return lp != nil && *lp == 250 })
}

// webBehindOneLBHost starts ebb lb on the first node and a one-replica
// Service of the test app, and waits until the router's only next hop for
// its address is that host.
func webBehindOneLBHost(t *testing.T, ctx context.Context) (lb localcluster.Node, vip, hop netip.Addr) {
	t.Helper()
	lb = cluster.Nodes[0]
	startLB(t, ctx, lb)
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vip = e2eutil.DeployLoadBalancedEcho(t, ctx, cluster, ns, "web", 1)
	hop = netip.MustParseAddr(lb.IP)
	waitNextHops(t, ctx, netip.PrefixFrom(vip, 32), []netip.Addr{hop})
	return lb, vip, hop
}

// setIBGP turns the router's sessions with the LB hosts, and the BGPPeer
// "router" of e2eutil.SetUpBGP, iBGP (both in the router's AS) or back
// to eBGP. It tries both halves and returns what failed.
func setIBGP(ctx context.Context, api ctrlclient.Client, on bool) []error {
	remote, mine := fmt.Sprint(localcluster.LBASN), int64(localcluster.LBASN)
	if on {
		remote, mine = "internal", localcluster.RouterASN
	}
	var errs []error
	if err := router.Configure(ctx, fmt.Sprintf("router bgp %d", localcluster.RouterASN), "neighbor ebb remote-as "+remote); err != nil {
		errs = append(errs, err)
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var peer lbv1alpha1.BGPPeer
		if err := api.Get(ctx, ctrlclient.ObjectKey{Name: "router"}, &peer); err != nil {
			return err
		}
		peer.Spec.MyASN = mine
		return api.Update(ctx, &peer)
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("BGPPeer router's myASN to %d: %w", mine, err))
	}
	return errs
}

// waitPath waits until the router holds a path for route via hop with
// exactly these communities and large communities, and a local
// preference localPref accepts.
func waitPath(t *testing.T, ctx context.Context, route netip.Prefix, hop netip.Addr, communities, large []string, localPref func(*uint32) bool) {
	t.Helper()
	e2eutil.Eventually(t, ctx, time.Minute, fmt.Sprintf("the router's path of %s via %s with communities %v and %v", route, hop, communities, large), func(ctx context.Context) (bool, string) {
		paths, err := router.Paths(ctx, route)
		if err != nil {
			return false, err.Error()
		}
		for _, p := range paths {
			if p.NextHop == hop && slices.Equal(p.Communities, communities) && slices.Equal(p.LargeCommunities, large) && localPref(p.LocalPreference) {
				t.Logf("the router's path of %s via %s: communities %v, large communities %v, local preference %s", route, hop, p.Communities, p.LargeCommunities, showLocalPref(p.LocalPreference))
				return true, ""
			}
		}
		var seen []string
		for _, p := range paths {
			seen = append(seen, fmt.Sprintf("via %s: communities %v, large communities %v, local preference %s", p.NextHop, p.Communities, p.LargeCommunities, showLocalPref(p.LocalPreference)))
		}
		return false, fmt.Sprintf("paths %q", seen)
	})
}

func showLocalPref(lp *uint32) string {
	if lp == nil {
		return "none"
	}
	return fmt.Sprint(*lp)
}

func ptrTo[T any](v T) *T { return &v }

// An AnnouncementPolicy with aggregationLength announces the /28 that
// holds the address instead of its /32: the router's route is the
// aggregate, the client reaches the Service through it, the host's
// report still lists the address as announced; without the policy the
// /32 comes back.
func TestAnnouncementPolicyAggregatesRoutes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	lb, vip, hop := webBehindOneLBHost(t, ctx)
	hostRoute, aggregate := netip.PrefixFrom(vip, 32), netip.PrefixFrom(vip, 28).Masked()

	api := e2eutil.APIClient(t, cluster)
	policy := &lbv1alpha1.AnnouncementPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "aggregated"},
		Spec: lbv1alpha1.AnnouncementPolicySpec{AddressPools: []string{ebbrun.DefaultPoolName},
			BGP: &lbv1alpha1.BGPAnnouncement{AggregationLength: ptrTo[int32](28)}},
	}
	if err := api.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if err := api.Delete(context.Background(), policy); err != nil && !(deleted && apierrors.IsNotFound(err)) {
			t.Errorf("deleting AnnouncementPolicy %s: %v", policy.Name, err)
		}
	})
	waitNextHops(t, ctx, aggregate, []netip.Addr{hop})
	waitNextHops(t, ctx, hostRoute, nil)
	t.Logf("%s announced as %s via %s", vip, aggregate, hop)

	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cluster.ExternalClient.DialContext}}
	url := fmt.Sprintf("http://%s/", vip)
	e2eutil.Eventually(t, ctx, 30*time.Second, "the client reaching "+url+" through "+aggregate.String(), func(ctx context.Context) (bool, string) {
		err := e2eutil.Answered(ctx, cluster, client, url)
		return err == nil, fmt.Sprint(err)
	})
	// An address of the aggregate that nothing serves is dropped on the
	// LB host, not routed back to the router (where it would loop until
	// its TTL ran out).
	unserved := addrrange.Last(aggregate).Prev()
	host, ok := cluster.Network.Host(lb.Name)
	if !ok {
		t.Fatalf("no host %s", lb.Name)
	}
	e2eutil.Eventually(t, ctx, 30*time.Second, lb.Name+" dropping "+unserved.String(), func(ctx context.Context) (bool, string) {
		kind := routeKind(host, unserved)
		return kind == "blackhole", "its route is " + kind
	})
	e2eutil.Eventually(t, ctx, 30*time.Second, lb.Name+"'s report listing "+vip.String()+" as announced", func(ctx context.Context) (bool, string) {
		r, err := e2eutil.ReportOn(ctx, api, lb.Name)
		if err != nil {
			return false, err.Error()
		}
		a := r.Status.Announcement
		return a != nil && slices.Contains(a.BGPAnnounced, vip.String()), fmt.Sprintf("%+v", a)
	})

	if err := api.Delete(ctx, policy); err != nil {
		t.Fatal(err)
	}
	deleted = true
	waitNextHops(t, ctx, hostRoute, []netip.Addr{hop})
	waitNextHops(t, ctx, aggregate, nil)
	e2eutil.Eventually(t, ctx, 30*time.Second, lb.Name+" no longer dropping "+unserved.String(), func(ctx context.Context) (bool, string) {
		kind := routeKind(host, unserved)
		return kind != "blackhole", "its route is " + kind
	})
}

// routeKind is how the host's kernel routes a: "blackhole", "local",
// "unicast" or the lookup's error.
func routeKind(host *network.Host, a netip.Addr) string {
	kind := ""
	err := host.Do(func() error {
		routes, err := netlink.RouteGet(a.AsSlice())
		switch {
		case errors.Is(err, unix.EINVAL):
			// The kernel answers a lookup that meets a blackhole so.
			kind = "blackhole"
		case err != nil:
			return err
		case len(routes) == 0:
			kind = "none"
		case routes[0].Type == unix.RTN_BLACKHOLE:
			kind = "blackhole"
		case routes[0].Type == unix.RTN_LOCAL:
			kind = "local"
		default:
			kind = "unicast"
		}
		return nil
	})
	if err != nil {
		return err.Error()
	}
	return kind
}
