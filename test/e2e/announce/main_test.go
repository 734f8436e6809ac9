// Package announce_test checks that load-balancer addresses reach the
// ebb lb hosts on a real network: ebb is installed from dist/install.yaml
// with the ebb lb DaemonSet announcing by BGP (the flags a user adds to
// it), and FRR on the router spreads a client's flows across the LB hosts
// (ECMP).
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

// setUp installs ebb with BGP announcement on ebb lb and no LB node yet
// (tests label theirs), removes the router's static route to the VIP pool
// (BGP is the only way there) and starts FRR on the router.
func setUp(c *localcluster.Cluster, dist string) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bgp := []string{"--bgp-asn", fmt.Sprint(localcluster.LBASN), "--bgp-peer", fmt.Sprintf("%s:%d", localcluster.RouterIP, localcluster.RouterASN), "--bgp-hold-time", holdTime.String()}
	if err := ebbrun.InstallManifest(ctx, c, filepath.Join(dist, "install.yaml"), ebbrun.ManifestOptions{LBArgs: bgp}); err != nil {
		return nil, err
	}
	if err := c.Router.DeleteRoute(localcluster.VIPPrefix); err != nil {
		return nil, err
	}
	var err error
	if router, err = c.StartBGPRouter(ctx, holdTime); err != nil {
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
	return e2eutil.LBPage(ctx, cluster, node, path)
}
