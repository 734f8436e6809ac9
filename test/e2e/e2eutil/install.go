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
	return InstallFromDistWith(dist, ebbrun.ManifestOptions{LBNodes: lbNodes})
}

// InstallFromDistWith is InstallFromDist with the manifest's options
// (ebb lb's nodes, the components' extra arguments).
func InstallFromDistWith(dist string, opts ebbrun.ManifestOptions) func(*localcluster.Cluster) (func(), error) {
	return func(c *localcluster.Cluster) (func(), error) {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		err := ebbrun.InstallManifest(ctx, c, filepath.Join(dist, "install.yaml"), opts)
		return func() {}, err
	}
}
