package demo

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// Install installs ebb from manifest (dist/install.yaml) as a user does,
// with ebb lb on the cluster's first node, routes the VIP pools to it from
// the router, and shapes o for that set-up: the clients sit behind the
// router, the apps run on the other nodes.
func Install(ctx context.Context, c *localcluster.Cluster, manifest string, o *Options) error {
	if len(c.Nodes) < 3 {
		return fmt.Errorf("the scenario needs 3 nodes (an LB host and two for the apps), not %d", len(c.Nodes))
	}
	lb := c.Nodes[0]
	if err := ebbrun.InstallManifest(ctx, c, manifest, ebbrun.ManifestOptions{LBNodes: []string{lb.Name}}); err != nil {
		return err
	}
	if err := c.RouteVIPsVia(netip.MustParseAddr(lb.IP), netip.MustParseAddr(lb.IPv6)); err != nil {
		return err
	}
	o.Dial = c.ExternalClient.DialContext
	o.AppNodes = nil
	for _, n := range c.Nodes[1:] {
		o.AppNodes = append(o.AppNodes, n.Name)
	}
	return nil
}

// SetBaseline rolls the installed ebb lb out with its admin state off (the
// baseline: a load balancer driven by health probes only) or back on.
func SetBaseline(ctx context.Context, c *localcluster.Cluster, baseline bool) error {
	return ebbrun.UpdateLBArgs(ctx, c, func(args []string) []string {
		args = slices.DeleteFunc(args, func(a string) bool { return a == disableAdminState })
		if baseline {
			args = append(args, disableAdminState)
		}
		return args
	})
}

// disableAdminState is the baseline's flag of ebb lb.
const disableAdminState = "--disable-admin-state"
