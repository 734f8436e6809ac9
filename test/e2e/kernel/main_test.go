// Package kernel_test checks the kernel engine's eBPF path as a user runs
// it: ebb is installed from dist/install-kernel-ebpf.yaml (config/default
// with the component config/components/kernel-ebpf), the ebb lb replicas
// announce by BGP, and a client behind the router reaches Services whose
// flows the tc program forwards, through a rolling upgrade of ebb lb and
// the maintenance of an LB host.
package kernel_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

var (
	cluster *localcluster.Cluster
	router  *localcluster.BGPRouter
)

func TestMain(m *testing.M) {
	dist := e2eutil.DistDir()
	// Real nodes. The upgrade tests lost long-lived connections in about
	// one run in three until 2026-11-29: the successor's BGP session did
	// not say it restarted, so FRR dropped the host's routes at its OPEN
	// for a moment (e2eutil.ExpectRestartedSessions).
	opts := localcluster.Options{Name: "e2e-kernel", Nodes: 3, RealKubelets: true, Images: []string{filepath.Join(dist, "oci")}}
	os.Exit(localcluster.RunTests(m, opts, &cluster, func(c *localcluster.Cluster) (func(), error) {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		var err error
		if router, err = e2eutil.SetUpBGP(ctx, c, filepath.Join(dist, "install-kernel-ebpf.yaml")); err != nil {
			return nil, err
		}
		return router.Stop, nil
	}))
}
