package announce_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// An AnnouncementPolicy's communities and large communities reach the
// router (FRR) on the route; its local preference does only over iBGP
// (RFC 4271 keeps it off eBGP sessions), so the router's peer group and
// the BGPPeer turn iBGP for the second half.
func TestAnnouncementPolicyAttributesReachTheRouter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	lb := cluster.Nodes[0]
	startLB(t, ctx, lb)
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vip := e2eutil.DeployLoadBalancedEcho(t, ctx, cluster, ns, "web", 1)
	route := netip.PrefixFrom(vip, 32)
	hop := netip.MustParseAddr(lb.IP)
	waitNextHops(t, ctx, route, []netip.Addr{hop})

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
	t.Cleanup(func() { _ = api.Delete(context.Background(), policy) })
	waitPath(t, ctx, route, hop, []string{"64512:100", "no-export"}, []string{"4200000000:1:2"}, func(lp *uint32) bool { return lp == nil || *lp != 250 })

	// A new community replaces the route's, without the route going.
	before := policy.DeepCopy()
	policy.Spec.BGP.Communities = []string{"64512:200"}
	if err := api.Patch(ctx, policy, ctrlclient.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	routes := e2eutil.WatchRoute(t, ctx, router, route, []netip.Addr{hop})
	waitPath(t, ctx, route, hop, []string{"64512:200"}, []string{"4200000000:1:2"}, func(lp *uint32) bool { return lp == nil || *lp != 250 })
	routes.Halt()
	if n := routes.Failed.Load(); n > 0 {
		t.Errorf("the router lost the route while its community changed (%d times; first: %v)", n, routes.FirstErr.Load())
	}

	// iBGP: the router's peer group and the BGPPeer's own AS number.
	setIBGP(t, ctx, api, true)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		setIBGP(t, ctx, api, false)
		waitNextHops(t, ctx, route, []netip.Addr{hop})
	})
	waitPath(t, ctx, route, hop, []string{"64512:200"}, []string{"4200000000:1:2"}, func(lp *uint32) bool { return lp != nil && *lp == 250 })
}

// setIBGP turns the router's sessions with the LB hosts, and the BGPPeer
// "router" of e2eutil.SetUpBGP, iBGP (both in the router's AS) or back
// to eBGP.
func setIBGP(t *testing.T, ctx context.Context, api ctrlclient.Client, on bool) {
	t.Helper()
	remote, mine := fmt.Sprint(localcluster.LBASN), int64(localcluster.LBASN)
	if on {
		remote, mine = "internal", localcluster.RouterASN
	}
	if err := router.Configure(ctx, fmt.Sprintf("router bgp %d", localcluster.RouterASN), "neighbor ebb remote-as "+remote); err != nil {
		t.Fatal(err)
	}
	var peer lbv1alpha1.BGPPeer
	if err := api.Get(ctx, ctrlclient.ObjectKey{Name: "router"}, &peer); err != nil {
		t.Fatal(err)
	}
	before := peer.DeepCopy()
	peer.Spec.MyASN = mine
	if err := api.Patch(ctx, &peer, ctrlclient.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
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
