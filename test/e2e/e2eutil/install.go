package e2eutil

import (
	"context"
	"path/filepath"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// InstallFromDist is a RunTests setup that installs ebb from dist's
// install.yaml as a user does, with ebb lb on lbNodes; the cluster must
// have dist's image layout (Options.Images).
func InstallFromDist(dist string, lbNodes ...string) func(*localcluster.Cluster) (func(), error) {
	return func(c *localcluster.Cluster) (func(), error) {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		err := ebbrun.InstallManifest(ctx, c, filepath.Join(dist, "install.yaml"), ebbrun.ManifestOptions{LBNodes: lbNodes})
		return func() {}, err
	}
}
