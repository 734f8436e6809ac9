// Package announce_test checks that load-balancer addresses reach the
// ebb lb hosts on a real network: ebb is installed from dist/install.yaml,
// a BGPPeer names the router (with a TCP MD5 password from a Secret), the
// ebb lb replicas announce by BGP, and FRR on the router spreads a
// client's flows across the LB hosts (ECMP).
package announce_test

import (
	"context"
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

func TestMain(m *testing.M) {
	dist := e2eutil.DistDir()
	opts := localcluster.Options{Name: "e2e-announce", Nodes: 3, RealKubelets: true, Images: []string{filepath.Join(dist, "oci")}}
	os.Exit(localcluster.RunTests(m, opts, &cluster, func(c *localcluster.Cluster) (func(), error) { return setUp(c, dist) }))
}

// setUp installs ebb with no LB node yet (tests label theirs), a BGPPeer
// for the router, and starts FRR there (e2eutil.SetUpBGP).
func setUp(c *localcluster.Cluster, dist string) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var err error
	if router, err = e2eutil.SetUpBGP(ctx, c, filepath.Join(dist, "install.yaml")); err != nil {
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
