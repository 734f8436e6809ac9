// Package install_test installs ebb as a user does, from dist/install.yaml
// with kubectl, on a local cluster whose pods of ebb's image run as real
// processes (`make release` builds the image and the manifest), and checks
// what a user would: both controller replicas run with one leader, the
// webhook answers through its Service, a LoadBalancer Service served by the
// ebb lb DaemonSet is reached from a client behind the router, and the
// leader's loss does not stop a maintenance in progress.
package install_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

var cluster *localcluster.Cluster

// lbNode runs ebb lb (the DaemonSet's nodeSelector picks it).
const lbNode = "node-1"

func TestMain(m *testing.M) {
	dist := e2eutil.DistDir()
	opts := localcluster.Options{Name: "e2e-install", Nodes: 4, RealKubelets: true, Images: []string{filepath.Join(dist, "oci")}}
	os.Exit(localcluster.RunTests(m, opts, &cluster, e2eutil.InstallFromDist(dist, lbNode)))
}
