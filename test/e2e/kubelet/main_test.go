// Package kubelet_test runs on a local cluster whose nodes are real: the
// upstream kubelet and containerd on every node, and pods of real images
// (ebb's own from dist/oci, installed from dist/install.yaml as a user
// does; agnhost, Kubernetes' own test server, for the apps). It checks what
// users get only from a real kubelet: exec, logs and port-forward, and a
// pod's graceful termination (preStop, then SIGTERM, then the grace period)
// as seen through ebb's load balancer.
package kubelet_test

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
	opts := localcluster.Options{Name: "e2e-kubelet", Nodes: 3, RealKubelets: true, Images: []string{filepath.Join(dist, "oci")}}
	os.Exit(localcluster.RunTests(m, opts, &cluster, e2eutil.InstallFromDist(dist, lbNode)))
}
