// Command bench-lb-lifecycle measures what the load-balancer tier's own
// lifecycle costs clients (issue 15): restarts of a load balancer on one
// host under load (ebb's socket hand-off against HAProxy's seamless reload,
// and a plain restart as the baseline), then, on the local cluster with
// ebb installed from dist/install.yaml and two LB hosts announcing by BGP,
// rolling upgrades of the ebb lb DaemonSet and a NodeMaintenance of an LB
// host. It prints a one-line JSON summary last and writes it to
// bench/results/lb-lifecycle.json.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ebbdev/ebb/bench/internal/benchcluster"
	"github.com/ebbdev/ebb/bench/internal/report"
	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/stats"
)

type options struct {
	ebb, dist, out            string
	runs, restarts, upgrade   int
	rate, long                int
	skipCluster, skipRestarts bool
	realKubelets              bool
}

func main() {
	var o options
	flag.StringVar(&o.ebb, "ebb", "bin/ebb", "the ebb binary")
	flag.StringVar(&o.dist, "dist", "dist", "make release's output (dist/oci, dist/install.yaml)")
	flag.StringVar(&o.out, "out", "bench/results/lb-lifecycle.json", "where the JSON summary goes")
	flag.IntVar(&o.runs, "runs", 3, "runs of each measurement")
	flag.IntVar(&o.restarts, "restarts", 10, "restarts per run of each load balancer on one host")
	flag.IntVar(&o.upgrade, "upgrades", 10, "rolling upgrades of the ebb lb DaemonSet per run")
	flag.IntVar(&o.rate, "rate", 1000, "requests per second, each on a new connection")
	flag.IntVar(&o.long, "long-lived", 50, "long-lived connections open through each restart, upgrade and drain")
	flag.BoolVar(&o.skipCluster, "skip-cluster", false, "measure only the restarts on one host")
	flag.BoolVar(&o.skipRestarts, "skip-restarts", false, "measure only the upgrades and the maintenance on the local cluster")
	flag.BoolVar(&o.realKubelets, "real-kubelets", false, "real nodes for the cluster part: the upstream kubelet and containerd, the app agnhost (root only; docs/local-cluster.md)")
	flag.Parse()
	benchcluster.Main("bench-lb-lifecycle", o.realKubelets, func() error { return run(o) })
}

func run(o options) error {
	// The namespaces' loopback and mounts, for both parts.
	if err := localcluster.SetupNamespace(); err != nil {
		return err
	}
	bin, err := filepath.Abs(o.ebb)
	if err != nil {
		return err
	}
	dist, err := filepath.Abs(o.dist)
	if err != nil {
		return err
	}
	summary := map[string]any{"runs": o.runs, "restarts_per_run": o.restarts, "upgrades_per_run": o.upgrade, "rate": o.rate, "long_lived": o.long, "nodes": benchcluster.NodesKind(o.realKubelets)}
	if !o.skipRestarts {
		if err := measureRestarts(o, bin, summary); err != nil {
			return err
		}
	}
	if !o.skipCluster {
		if err := measureCluster(o, dist, summary); err != nil {
			return err
		}
	}
	return report.WriteSummary(o.out, summary)
}

// measureRestarts runs each contender runs times, alternating.
func measureRestarts(o options, bin string, summary map[string]any) error {
	b, stop, err := startBackends(4)
	if err != nil {
		return err
	}
	defer stop()
	totals := map[string]*restartResult{}
	for i := range o.runs {
		for _, name := range []string{"ebb-handoff", "haproxy-reload", "ebb-restart"} {
			dir, err := os.MkdirTemp("", "bench-lb-lifecycle-")
			if err != nil {
				return err
			}
			fe, err := newFrontends()
			if err != nil {
				return err
			}
			var c contender
			switch name {
			case "haproxy-reload":
				c, err = haproxyContender(dir, fe, b)
			default:
				c, err = ebbContender(bin, dir, fe, b, name == "ebb-handoff")
			}
			if err != nil {
				return err
			}
			res, err := runRestarts(c, fe, o.restarts, o.rate, o.long)
			if err != nil {
				return fmt.Errorf("%s (logs in %s): %w", name, dir, err)
			}
			fmt.Fprintf(os.Stderr, "run %d %s: %d restarts, %d of %d requests failed, %d of %d long-lived broken %s\n",
				i+1, name, res.RestartsMeasured, res.Failed, res.Sent, res.LongLivedBroken, res.LongLived, res.FirstFailure)
			t := totals[name]
			if t == nil {
				t = &restartResult{}
				totals[name] = t
			}
			t.Sent, t.Failed = t.Sent+res.Sent, t.Failed+res.Failed
			t.LongLived, t.LongLivedBroken = t.LongLived+res.LongLived, t.LongLivedBroken+res.LongLivedBroken
			_ = os.RemoveAll(dir)
		}
	}
	summary["handoff_restart_failed_requests"] = totals["ebb-handoff"].Failed
	summary["handoff_restart_reset_connections"] = totals["ebb-handoff"].LongLivedBroken
	summary["haproxy_reload_failed_requests"] = totals["haproxy-reload"].Failed
	summary["haproxy_reload_reset_connections"] = totals["haproxy-reload"].LongLivedBroken
	summary["baseline_restart_failed_requests"] = totals["ebb-restart"].Failed
	summary["baseline_restart_reset_connections"] = totals["ebb-restart"].LongLivedBroken
	summary["restart_requests_sent_per_contender"] = totals["ebb-handoff"].Sent
	return nil
}

// measureCluster runs the rolling upgrades and the LB host maintenance on
// the local cluster, each under rate requests per second.
func measureCluster(o options, dist string, summary map[string]any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	lc, stop, err := startLBCluster(ctx, dist, o.realKubelets)
	if err != nil {
		return err
	}
	defer stop()
	var upFailed, upSent, lbFailed, lbSent int64
	var upBroken, lbBroken int
	var drains []float64
	for i := range o.runs {
		reqs := &loadgen.Requests{URL: lc.url(), Rate: o.rate, Dial: lc.c.ExternalClient.DialContext}
		reqs.Start()
		for u := range o.upgrade {
			broken, err := lc.upgrade(ctx, reqs, o.long)
			if err != nil {
				reqs.Stop()
				return fmt.Errorf("run %d, upgrade %d: %w", i+1, u+1, err)
			}
			upBroken += broken
		}
		reqs.Stop()
		printFailures(reqs)
		sent, failed := reqs.Counts()
		upSent, upFailed = upSent+sent, upFailed+failed
		fmt.Fprintf(os.Stderr, "run %d: %d rolling upgrades, %d of %d requests failed (%s), %d long-lived broken so far\n", i+1, o.upgrade, failed, sent, reqs.LastError(), upBroken)

		reqs = &loadgen.Requests{URL: lc.url(), Rate: o.rate, Dial: lc.c.ExternalClient.DialContext}
		reqs.Start()
		broken, took, err := lc.maintainLBHost(ctx, reqs, o.long, i)
		reqs.Stop()
		printFailures(reqs)
		if err != nil {
			return fmt.Errorf("run %d, LB host maintenance: %w", i+1, err)
		}
		sent, failed = reqs.Counts()
		lbSent, lbFailed, lbBroken = lbSent+sent, lbFailed+failed, lbBroken+broken
		drains = append(drains, took.Seconds())
		fmt.Fprintf(os.Stderr, "run %d: LB host maintenance, %d of %d requests failed (%s), %d of %d long-lived broken, Drained after %.1f s\n", i+1, failed, sent, reqs.LastError(), broken, o.long, took.Seconds())
	}
	summary["upgrade_failed_requests"] = upFailed
	summary["upgrade_requests_sent"] = upSent
	summary["upgrade_reset_connections"] = upBroken
	summary["lbhost_drain_failed_requests"] = lbFailed
	summary["lbhost_drain_requests_sent"] = lbSent
	summary["lbhost_drain_reset_connections"] = lbBroken
	summary["lbhost_drain_seconds"] = stats.Median(drains)
	return nil
}
