// Package benchcluster is the start-up the cluster benchmarks share: run
// inside the local cluster's private namespaces, start a cluster that runs
// ebb's image, to install ebb from dist/install.yaml.
package benchcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ebbdev/ebb/internal/localcluster"
)

// Main re-executes the benchmark inside new namespaces (once), then runs
// run there and exits: 1, with the error printed under name, if it fails.
// A benchmark on real nodes keeps the host's user namespace
// (realKubelets; root only).
func Main(name string, realKubelets bool, run func() error) {
	if !localcluster.InNamespace() {
		reexec := localcluster.Reexec
		if realKubelets {
			reexec = localcluster.ReexecInHostUserNamespace
		}
		code, err := reexec()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		os.Exit(code)
	}
	// The benchmarks' API clients log nothing worth reading; without a
	// logger, controller-runtime prints a stack trace into the results.
	ctrllog.SetLogger(logr.Discard())
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// Start sets up the namespace and starts a cluster of nodes named name
// (its progress on stderr), simulated nodes that run pods of ebb's image as
// processes or, with realKubelets, real nodes, for a benchmark that
// installs ebb from dist (`make release` writes dist/install.yaml and the
// image layout dist/oci). It returns the cluster and the manifest's
// absolute path; the caller stops the cluster.
func Start(ctx context.Context, name, dist string, nodes int, realKubelets bool) (*localcluster.Cluster, string, error) {
	if err := localcluster.SetupNamespace(); err != nil {
		return nil, "", err
	}
	manifest, err := filepath.Abs(filepath.Join(dist, "install.yaml"))
	if err != nil {
		return nil, "", err
	}
	if _, err := os.Stat(manifest); err != nil {
		return nil, "", fmt.Errorf("%w: run `make release` (the make target does)", err)
	}
	c, err := localcluster.Start(ctx, localcluster.Options{Name: name, Nodes: nodes, Progress: os.Stderr, Images: []string{filepath.Join(filepath.Dir(manifest), "oci")}, RealKubelets: realKubelets})
	if err != nil {
		return nil, "", err
	}
	return c, manifest, nil
}
