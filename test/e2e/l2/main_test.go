// Package l2_test checks L2 announcement on the local cluster's node
// network: ebb is installed from dist/install.yaml with ebb lb announcing
// on eth0 (the flag a user adds), and the router reaches the addresses on
// link, by ARP, as a router does for a subnet on a segment.
package l2_test

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

var cluster *localcluster.Cluster

func TestMain(m *testing.M) {
	dist := e2eutil.DistDir()
	opts := localcluster.Options{Name: "e2e-l2", Nodes: 3, Images: []string{filepath.Join(dist, "oci")}}
	os.Exit(localcluster.RunTests(m, opts, &cluster, func(c *localcluster.Cluster) (func(), error) { return setUp(c, dist) }))
}

// setUp installs ebb with L2 announcement on the node network and no LB
// node yet (tests label theirs), and replaces the router's static route to
// the VIP pool with an on-link one: the router asks the segment who has
// each address.
func setUp(c *localcluster.Cluster, dist string) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	l2 := []string{"--l2-interface", "eth0"}
	if err := ebbrun.InstallManifest(ctx, c, filepath.Join(dist, "install.yaml"), ebbrun.ManifestOptions{LBArgs: l2}); err != nil {
		return nil, err
	}
	if err := c.Router.DeleteRoute(localcluster.VIPPrefix); err != nil {
		return nil, err
	}
	if err := c.Router.AddLinkRoute(localcluster.VIPPrefix, "eth0"); err != nil {
		return nil, err
	}
	return func() {}, nil
}
