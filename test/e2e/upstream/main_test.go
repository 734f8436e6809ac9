// Package upstream_test holds ebb to Kubernetes' own tests: the upstream
// e2e test binary (e2e.test, built from k8s.io/kubernetes/test/e2e by
// hack/upstream-e2e.sh) runs its LoadBalancer and Service cases against a
// local cluster of real kubelets with ebb installed from dist/install.yaml
// as the cluster's default load balancer (class-less Services are ebb's).
// The binary runs on the client host behind the router, so it reaches
// Service addresses the way a client does. The cluster runs CoreDNS, and
// the app image carries wget, OpenBSD nc and curl, which the cases run in
// their pods. EBB_UPSTREAM_E2E is the directory hack/upstream-e2e.sh
// builds e2e.test and coredns into.
//
// `make e2e` (CI) runs a focused set of LoadBalancer cases; `make
// conformance` runs every case that applies (EBB_UPSTREAM_FOCUS=full) and
// prints the table and the JSON summary (docs/conformance.md).
package upstream_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	utilnet "k8s.io/apimachinery/pkg/util/net"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

var cluster *localcluster.Cluster

// lbNode runs ebb lb; the router sends the VIP pools to it.
const lbNode = "node-1"

func TestMain(m *testing.M) {
	dist := e2eutil.DistDir()
	// Three nodes: the upstream cases want two schedulable nodes at least
	// (client pods on two nodes, a DaemonSet rolled across several).
	// Kubernetes' default node port range: the upstream tests hard-code it.
	// The cluster DNS: the cases reach Services by name from pods.
	opts := localcluster.Options{Name: "e2e-upstream", Nodes: 3, RealKubelets: true, Images: []string{filepath.Join(dist, "oci")},
		NodePorts: utilnet.PortRange{Base: 30000, Size: 2768}}
	if dir := os.Getenv("EBB_UPSTREAM_E2E"); dir != "" {
		opts.CoreDNS = filepath.Join(dir, "coredns")
	}
	// ebb as the cluster's default load balancer: the upstream cases
	// create Services without a class.
	install := e2eutil.InstallFromDistWith(dist, ebbrun.ManifestOptions{
		LBNodes:        []string{lbNode},
		ControllerArgs: []string{"--default-load-balancer"},
		LBArgs:         []string{"--default-load-balancer"},
	})
	os.Exit(localcluster.RunTests(m, opts, &cluster, install, routeVIPsVia(lbNode)))
}

// routeVIPsVia sends the router's routes to the VIP pools through node
// name, the LB host (and back to the default when the suite ends).
func routeVIPsVia(name string) func(*localcluster.Cluster) (func(), error) {
	return func(c *localcluster.Cluster) (func(), error) {
		n, ok := c.Node(name)
		if !ok {
			return nil, fmt.Errorf("no node %s to route the VIP pools through", name)
		}
		if err := c.RouteVIPsVia(netip.MustParseAddr(n.IP), netip.MustParseAddr(n.IPv6)); err != nil {
			return nil, err
		}
		return func() { _ = c.RouteVIPs() }, nil
	}
}
