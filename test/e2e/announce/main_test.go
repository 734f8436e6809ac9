// Package announce_test checks that load-balancer addresses reach the
// ebb lb hosts on a real network: ebb is installed from dist/install.yaml,
// a BGPPeer names the router (with a TCP MD5 password from a Secret), the
// ebb lb replicas announce by BGP, and FRR on the router spreads a
// client's flows across the LB hosts (ECMP).
package announce_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

var (
	cluster *localcluster.Cluster
	router  *localcluster.BGPRouter
)

// holdTime is the BGP hold time of the router and the speakers: the least
// FRR accepts, so that a vanished host's routes go within 3 s.
const holdTime = 3 * time.Second

func TestMain(m *testing.M) {
	dist := e2eutil.DistDir()
	opts := localcluster.Options{Name: "e2e-announce", Nodes: 3, Images: []string{filepath.Join(dist, "oci")}}
	os.Exit(localcluster.RunTests(m, opts, &cluster, func(c *localcluster.Cluster) (func(), error) { return setUp(c, dist) }))
}

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
`, bgpPassword, localcluster.RouterIP, localcluster.RouterASN, localcluster.LBASN, holdTime)

// setUp installs ebb with no LB node yet (tests label theirs) and a
// BGPPeer for the router, removes the router's static route to the VIP
// pool (BGP is the only way there) and starts FRR on the router.
func setUp(c *localcluster.Cluster, dist string) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := ebbrun.InstallManifest(ctx, c, filepath.Join(dist, "install.yaml"), ebbrun.ManifestOptions{}); err != nil {
		return nil, err
	}
	if err := ebbrun.ApplyYAML(ctx, c, "bgppeer", routerPeer); err != nil {
		return nil, err
	}
	if err := c.DeleteVIPRoutes(); err != nil {
		return nil, err
	}
	var err error
	if router, err = c.StartBGPRouter(ctx, localcluster.BGPRouterOptions{HoldTime: holdTime, Password: bgpPassword}); err != nil {
		return nil, err
	}
	return router.Stop, nil
}

// startLB makes node an LB node and waits until its ebb lb is ready
// (e2eutil.StartLB).
func startLB(t *testing.T, ctx context.Context, node localcluster.Node) func() {
	t.Helper()
	return e2eutil.StartLB(t, ctx, cluster, node)
}

// lbPage gets a page of the ebb lb on node's host.
func lbPage(ctx context.Context, node localcluster.Node, path string) (string, error) {
	return ebbrun.LBPage(ctx, cluster, node, path)
}
