// Package l2_test checks L2 announcement on the local cluster's node
// network: ebb is installed from dist/install.yaml with ebb lb announcing
// on eth0 (the flag a user adds), and the router reaches the addresses on
// link, by ARP, as a router does for a subnet on a segment.
package l2_test

import (
	"context"
	"net/netip"
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
	opts := localcluster.Options{Name: "e2e-l2", Nodes: 3, RealKubelets: true, Images: []string{filepath.Join(dist, "oci")}}
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
	if err := c.RouteVIPsOnLink(); err != nil {
		return nil, err
	}
	return func() {}, nil
}

// lbHosts makes nodes LB hosts (e2eutil.StartLB) and returns each one's
// stop function and the node of each host's eth0 MAC: what the router's
// neighbour table names.
func lbHosts(t *testing.T, ctx context.Context, nodes ...localcluster.Node) (stops map[string]func(), byMAC map[string]string) {
	t.Helper()
	stops, byMAC = map[string]func(){}, map[string]string{}
	for _, n := range nodes {
		stops[n.Name] = e2eutil.StartLB(t, ctx, cluster, n)
		mac, err := n.Host.HardwareAddr("eth0")
		if err != nil {
			t.Fatal(err)
		}
		byMAC[mac.String()] = n.Name
	}
	return stops, byMAC
}

// routerOwner is the LB host that the router's neighbour entry for vip
// names ("" when it names none).
func routerOwner(byMAC map[string]string, vip netip.Addr) string {
	mac, _, err := cluster.Router.Neighbour(vip)
	if err != nil || mac == nil {
		return ""
	}
	return byMAC[mac.String()]
}
