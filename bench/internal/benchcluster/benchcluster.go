// Package benchcluster is the start-up the cluster benchmarks share: run
// inside the local cluster's private namespaces, start a cluster that runs
// ebb's image, to install ebb from dist/install.yaml.
package benchcluster

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/kubeproxy"
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

// Start sets up the namespace and starts the cluster opts describes (its
// name, nodes, real or simulated; its progress on stderr, ebb's image
// imported) for a benchmark that installs ebb from dist (`make release`
// writes dist/install.yaml and the image layout dist/oci). It returns the
// cluster and the manifest's absolute path; the caller stops the cluster.
func Start(ctx context.Context, dist string, opts localcluster.Options) (*localcluster.Cluster, string, error) {
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
	opts.Progress = os.Stderr
	opts.Images = append(opts.Images, filepath.Join(filepath.Dir(manifest), "oci"))
	c, err := localcluster.Start(ctx, opts)
	if err != nil {
		return nil, "", err
	}
	return c, manifest, nil
}

// NodesKind names the cluster's kind of nodes for a benchmark's summary
// (its JSON key "nodes"), so that no figure is read without it.
func NodesKind(realKubelets bool) string {
	if realKubelets {
		return "real kubelets"
	}
	return "kwok-simulated kubelets"
}

// KubeProxyMinSyncPeriodFlag defines the flag -kube-proxy-min-sync-period
// (every kube-proxy's minSyncPeriod, Options.KubeProxyMinSyncPeriod) on
// the command line and returns where its value goes. A value of 0 or less
// is refused: kube-proxy would read 0 as unset and use 1 s, and the
// summary would record what did not run.
func KubeProxyMinSyncPeriodFlag() *time.Duration {
	d := kubeproxy.DefaultMinSyncPeriod
	flag.Func("kube-proxy-min-sync-period", fmt.Sprintf("every kube-proxy's minSyncPeriod, above 0 (default upstream's %s)", d), func(s string) error {
		v, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		if v <= 0 {
			return fmt.Errorf("%s: must be above 0 (kube-proxy reads 0 as unset and uses %s)", s, kubeproxy.DefaultMinSyncPeriod)
		}
		d = v
		return nil
	})
	return &d
}

// DeleteNamespace deletes a run's namespace and waits up to 2 minutes for
// it to be gone, so that runs neither add up nor overlap (the next run's
// Services may get the addresses and node ports it releases); a namespace
// that stays is an error (a finalizer nobody removes).
func DeleteNamespace(ctx context.Context, c *localcluster.Cluster, name string) error {
	if err := c.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting namespace %s: %w", name, err)
	}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		return fmt.Errorf("namespace %s not gone 2 min after its deletion", name)
	}
	return nil
}
