// Package helm_test installs ebb as a Helm user does, from the chart that
// `make release` packages (dist/ebb-VERSION.tgz, ebb's image pinned by
// digest), on a local cluster of real kubelets: helm install, a Service
// served through the router, helm upgrade under traffic with nothing
// dropped, and helm uninstall leaving no ebb object behind but the CRDs
// (kept by default) and no Service stuck on ebb's finalizer.
package helm_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

var cluster *localcluster.Cluster

// lbNode runs ebb lb (the chart's default nodeSelector picks it).
const lbNode = "node-1"

func TestMain(m *testing.M) {
	opts := localcluster.Options{Name: "e2e-helm", Nodes: 3, RealKubelets: true, Images: []string{filepath.Join(e2eutil.DistDir(), "oci")}}
	os.Exit(localcluster.RunTests(m, opts, &cluster))
}
