package e2eutil

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

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
	hasAll := func() ([]netip.Addr, error) {
		routes, err := router.Routes(ctx)
		if err != nil || slices.Equal(routes[route], want) {
			return nil, err
		}
		return append([]netip.Addr{}, routes[route]...), nil
	}
	l.Go(func() {
		for !l.Stopped() {
			got, err := hasAll()
			if err == nil && got != nil {
				time.Sleep(100 * time.Millisecond)
				if got, err = hasAll(); err == nil && got != nil {
					at := time.Now().Format(time.TimeOnly)
					l.Fail(fmt.Errorf("%s via %v at %s, twice 100 ms apart; FRR's detail right after:\n%s", route, got, at, router.RouteDetail(ctx, route)))
				}
			}
			switch {
			case err != nil:
				l.Fail(err)
			case got == nil:
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
