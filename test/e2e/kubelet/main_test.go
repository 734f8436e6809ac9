// Package kubelet_test runs on a local cluster whose nodes are real: the
// upstream kubelet and containerd on every node, pods of real images (ebb's
// own, agnhost), and checks what users get only from a real kubelet.
package kubelet_test

import (
	"os"
	"testing"

	"github.com/ebbdev/ebb/internal/localcluster"
)

var cluster *localcluster.Cluster

func TestMain(m *testing.M) {
	opts := localcluster.Options{Name: "e2e-kubelet", Nodes: 3, RealKubelets: true}
	os.Exit(localcluster.RunTests(m, opts, &cluster))
}

