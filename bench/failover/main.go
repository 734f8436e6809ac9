// Command bench-failover measures what an LB host that dies costs clients,
// for each way of announcing the load-balancer addresses (issue 14): on
// the local cluster, with ebb installed from dist/install.yaml and two LB
// hosts, once announcing by BGP to FRR on the router and once by L2 (ARP,
// the router reaching the pool on link). Under a constant rate of new
// connections from the client behind the router, one LB host is cut off
// the node network (a vanished machine: nothing on it is told), and a
// prober that opens a connection every 10 ms says when new connections
// succeed again. It also measures how long a new Service's address takes
// to be reachable from the client. It prints a one-line JSON summary last
// and writes it to bench/results/failover.json.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ebbdev/ebb/bench/internal/benchcluster"
	"github.com/ebbdev/ebb/bench/internal/report"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/stats"
)

type options struct {
	dist, out string
	runs      int
	rate      int
	services  int
	modes     string
	// realKubelets runs real nodes (root only).
	realKubelets bool
}

func main() {
	var o options
	flag.StringVar(&o.dist, "dist", "dist", "make release's output (dist/oci, dist/install.yaml)")
	flag.StringVar(&o.out, "out", "bench/results/failover.json", "where the JSON summary goes")
	flag.IntVar(&o.runs, "runs", 3, "LB hosts cut off per announcement mode")
	flag.IntVar(&o.rate, "rate", 1000, "requests per second, each on a new connection")
	flag.IntVar(&o.services, "services", 20, "Services created one after another to time their address becoming reachable")
	flag.StringVar(&o.modes, "modes", "bgp,l2", "announcement modes to measure: bgp, l2 or both")
	flag.BoolVar(&o.realKubelets, "real-kubelets", false, "real nodes: the upstream kubelet and containerd, the app agnhost (root only; docs/local-cluster.md)")
	flag.Parse()
	benchcluster.Main("bench-failover", o.realKubelets, func() error { return run(o) })
}

func run(o options) error {
	if err := localcluster.SetupNamespace(); err != nil {
		return err
	}
	dist, err := filepath.Abs(o.dist)
	if err != nil {
		return err
	}
	summary := map[string]any{"nodes": benchcluster.NodesKind(o.realKubelets), "runs": o.runs, "rate": o.rate, "services": o.services,
		"bgp_hold_time_ms": bgpHoldTime.Milliseconds(), "l2_dead_after_ms": l2DeadAfter.Milliseconds()}
	var reachable, served []time.Duration
	for _, mode := range []string{"bgp", "l2"} {
		if !slices.Contains(strings.Split(o.modes, ","), mode) {
			continue
		}
		res, err := measureMode(o, dist, mode)
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		summary[mode+"_failover_ms"] = stats.Percentile(res.failovers, 0.5).Milliseconds()
		summary[mode+"_failover_ms_max"] = slices.Max(res.failovers).Milliseconds()
		summary[mode+"_failed_requests"] = res.failed
		summary[mode+"_requests"] = res.sent
		summary[mode+"_vip_reachable_ms_p50"] = stats.Percentile(res.reachable, 0.5).Milliseconds()
		summary[mode+"_vip_reachable_ms_p99"] = stats.Percentile(res.reachable, 0.99).Milliseconds()
		summary[mode+"_vip_served_ms_p50"] = stats.Percentile(res.served, 0.5).Milliseconds()
		summary[mode+"_vip_served_ms_p99"] = stats.Percentile(res.served, 0.99).Milliseconds()
		reachable = append(reachable, res.reachable...)
		served = append(served, res.served...)
	}
	summary["vip_reachable_ms_p99"] = stats.Percentile(reachable, 0.99).Milliseconds()
	summary["vip_served_ms_p99"] = stats.Percentile(served, 0.99).Milliseconds()
	return report.WriteSummary(o.out, summary)
}

// modeResult is one announcement mode's figures over its runs.
type modeResult struct {
	failovers         []time.Duration
	sent, failed      int64
	reachable, served []time.Duration
}

// measureMode starts a cluster announcing by mode, times new Services'
// addresses, then cuts an LB host off o.runs times under load.
func measureMode(o options, dist, mode string) (*modeResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	fc, stop, err := startCluster(ctx, dist, mode, o.realKubelets)
	if err != nil {
		return nil, err
	}
	defer stop()
	res := &modeResult{}
	ts, err := fc.timeReachable(ctx, o.services)
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		res.reachable, res.served = append(res.reachable, t.reachable), append(res.served, t.served)
	}
	fmt.Fprintf(os.Stderr, "%s: %d new Services: reachable from the client after p50 %s, p99 %s; served after p50 %s, p99 %s\n", mode, o.services,
		stats.Percentile(res.reachable, 0.5).Round(time.Millisecond), stats.Percentile(res.reachable, 0.99).Round(time.Millisecond),
		stats.Percentile(res.served, 0.5).Round(time.Millisecond), stats.Percentile(res.served, 0.99).Round(time.Millisecond))
	for i := range o.runs {
		r, err := fc.cutOne(ctx, i, o.rate)
		if err != nil {
			return nil, fmt.Errorf("run %d: %w", i+1, err)
		}
		fmt.Fprintf(os.Stderr, "%s run %d: %s cut off; new connections succeed again after %s; %d of %d requests failed\n",
			mode, i+1, r.host, r.failover.Round(time.Millisecond), r.failed, r.sent)
		res.failovers = append(res.failovers, r.failover)
		res.sent, res.failed = res.sent+r.sent, res.failed+r.failed
	}
	return res, nil
}
