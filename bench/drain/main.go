// Command drain benchmarks ebb's reason to exist: a node drained, taken
// down for its maintenance and brought back under constant traffic (new
// connections at a fixed rate plus long-lived connections), with ebb
// (NodeMaintenance, admin state, surge) and with the way clusters do it
// today (cordon, kubectl's drain library, a load balancer driven by its
// health probes), several runs each on the same local cluster. The last
// line printed is a JSON summary, also written to bench/results/drain.json.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/ebbdev/ebb/bench/internal/benchcluster"
	"github.com/ebbdev/ebb/bench/internal/report"
	"github.com/ebbdev/ebb/internal/demo"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/stats"
)

func main() {
	dist := flag.String("dist", "dist", "where `make release` wrote install.yaml and the image layout oci, which the benchmark installs")
	runs := flag.Int("runs", 3, "runs of each mode")
	rate := flag.Int("rate", 1000, "new connections per second")
	longLived := flag.Int("long-lived", 50, "long-lived connections")
	out := flag.String("out", "bench/results/drain.json", "where to write the JSON summary")
	withBaseline := flag.Bool("baseline", true, "also run the baseline (off: ebb only, e.g. to investigate)")
	realKubelets := flag.Bool("real-kubelets", false, "real nodes: the upstream kubelet and containerd, the apps agnhost (root only; docs/local-cluster.md)")
	kubeProxyMinSync := benchcluster.KubeProxyMinSyncPeriodFlag()
	flag.Parse()
	cluster := localcluster.Options{Name: "bench-drain", Nodes: 3, RealKubelets: *realKubelets, KubeProxyMinSyncPeriod: *kubeProxyMinSync}
	benchcluster.Main("bench-drain", *realKubelets, func() error {
		return run(*dist, cluster, *runs, *rate, *longLived, *withBaseline, *out)
	})
}

func run(dist string, cluster localcluster.Options, runs, rate, longLived int, withBaseline bool, out string) error {
	ctx := context.Background()
	c, manifest, err := benchcluster.Start(ctx, dist, cluster)
	if err != nil {
		return err
	}
	defer c.Stop()
	// As the demo: ebb installed from the manifest with ebb lb on the
	// first node, the clients behind the router, the apps on the others.
	opts := demo.DefaultOptions()
	opts.Rate, opts.LongLived, opts.Progress = rate, longLived, os.Stderr
	if err := demo.Install(ctx, c, manifest, &opts); err != nil {
		return err
	}
	baselineOn := false
	results := map[string][]*demo.Result{}
	for i := range runs {
		for _, baseline := range []bool{false, true} {
			if baseline && !withBaseline {
				continue
			}
			if baseline != baselineOn {
				if err := demo.SetBaseline(ctx, c, baseline); err != nil {
					return err
				}
				baselineOn = baseline
			}
			o := opts
			o.Baseline = baseline
			o.Namespace = fmt.Sprintf("drain-%d-%v", i, map[bool]string{false: "ebb", true: "baseline"}[baseline])
			res, err := demo.Run(ctx, c, o)
			if err != nil {
				return err
			}
			results[res.Mode] = append(results[res.Mode], res)
			fmt.Fprintf(os.Stderr, "run %d %s: %d of %d failed, %d of %d long-lived reset, p99 %.1f ms, drain %.1f s, cutover %.0f ms\n",
				i+1, res.Mode, res.RequestsFailed, res.RequestsSent, res.ResetConnections, res.LongLivedOpened, res.P99Ms, res.DrainSeconds, res.CutoverMs)
			// The apps of a finished run go before the next starts, so runs
			// do not add up nor overlap (the next run's Services may get
			// the addresses and node ports they release).
			if err := benchcluster.DeleteNamespace(ctx, c, o.Namespace); err != nil {
				return err
			}
		}
	}
	summary := map[string]any{"date": time.Now().UTC().Format(time.RFC3339), "runs": runs, "rate_per_second": rate, "long_lived": longLived, "nodes": benchcluster.NodesKind(cluster.RealKubelets),
		"kube_proxy_min_sync_period_ms": cluster.KubeProxyMinSyncPeriod.Milliseconds()}
	for mode, prefix := range map[string]string{"ebb": "ebb", "baseline": "baseline"} {
		var failed, reset int64
		var p99s, drains, cutovers []float64
		var perRun []int64
		for _, r := range results[mode] {
			failed += r.RequestsFailed
			reset += r.ResetConnections
			perRun = append(perRun, r.RequestsFailed)
			p99s, drains, cutovers = append(p99s, r.P99Ms), append(drains, r.DrainSeconds), append(cutovers, r.CutoverMs)
		}
		summary[prefix+"_failed_requests"] = failed
		summary[prefix+"_failed_requests_per_run"] = perRun
		summary[prefix+"_reset_connections"] = reset
		summary[prefix+"_p99_ms"] = median(p99s)
		summary[prefix+"_drain_seconds"] = median(drains)
		summary[prefix+"_cutover_ms"] = median(cutovers)
	}
	return report.WriteSummary(out, summary)
}

// median is the median to one decimal.
func median(v []float64) float64 { return float64(int(stats.Median(v)*10)) / 10 }
