// Command faults benchmarks what ebb promises when something fails in the
// middle of a drain: the demo's drain scenario (new connections at a fixed
// rate, long-lived connections, a NodeMaintenance from Drain to Complete)
// run once without a fault, then once per fault, each injected at a moment
// of the drain drawn from a seeded generator (printed, repeatable with
// -seed). For each: the requests that failed and the long-lived
// connections that broke, how long ebb took to be whole again after the
// fault ended, and what was left half done. Real kubelets only (the
// faults kill containers' processes). The last line printed is a JSON
// summary, also written to bench/results/faults.json.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ebbdev/ebb/bench/internal/benchcluster"
	"github.com/ebbdev/ebb/bench/internal/report"
	"github.com/ebbdev/ebb/internal/demo"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

type config struct {
	dist      string
	rate      int
	longLived int
	seed      uint64
	window    time.Duration
	faults    []fault
	out       string
	// engine is ebb lb's --engine ("": the manifest's).
	engine string
}

func main() {
	var cfg config
	flag.StringVar(&cfg.dist, "dist", "dist", "where `make release` wrote install.yaml and the image layout oci, which the benchmark installs")
	// The demo's load, not bench-drain's 1,000 and 50: on a 2-core machine
	// running a cluster of real kubelets, 1,000 failed most requests
	// without any fault (docs/reliability.md), which measures the machine.
	flag.IntVar(&cfg.rate, "rate", 200, "new connections per second")
	flag.IntVar(&cfg.longLived, "long-lived", 10, "long-lived connections")
	flag.Uint64Var(&cfg.seed, "seed", uint64(time.Now().UnixNano()), "seed of the moments the faults are injected at (printed; the same seed, the same moments)")
	flag.DurationVar(&cfg.window, "window", 10*time.Second, "a fault is injected at a moment drawn from [0, window) after the drain started (a drain takes about 10 to 18 s here)")
	list := flag.String("faults", "all", "the faults to inject, comma-separated, or all")
	flag.StringVar(&cfg.out, "out", "bench/results/faults.json", "where to write the JSON summary")
	flag.StringVar(&cfg.engine, "engine", "", "ebb lb's --engine (Proxy, Kernel or Auto; empty: the manifest's default, Proxy)")
	flag.Parse()
	var err error
	if cfg.faults, err = selectFaults(*list); err != nil {
		fmt.Fprintln(os.Stderr, "bench-faults:", err)
		os.Exit(2)
	}
	benchcluster.Main("bench-faults", true, func() error { return run(cfg) })
}

// outcome is one run's figures.
type outcome struct {
	Fault string `json:"fault"`
	// AtS is when the fault was injected, in seconds after the drain
	// started.
	AtS            float64 `json:"at_s"`
	Requests       int64   `json:"requests"`
	FailedRequests int64   `json:"failed_requests"`
	// FailedRatio is FailedRequests over Requests: a run lasts as long as
	// its fault needs, so counts alone do not compare.
	FailedRatio      float64 `json:"failed_ratio"`
	ResetConnections int64   `json:"reset_connections"`
	// ConvergeS is from the end of the fault (the kill, or the end of an
	// outage) until ebb was whole again (whole); null if it never was.
	ConvergeS     *float64 `json:"converge_s"`
	Violations    int      `json:"violations"`
	ViolationList []string `json:"violation_list,omitempty"`
	Error         string   `json:"error,omitempty"`
}

func run(cfg config) error {
	ctx := context.Background()
	c, manifest, err := benchcluster.Start(ctx, cfg.dist, localcluster.Options{Name: "bench-faults", Nodes: 3, RealKubelets: true})
	if err != nil {
		return err
	}
	defer c.Stop()
	opts := demo.DefaultOptions()
	opts.Rate, opts.LongLived, opts.Progress = cfg.rate, cfg.longLived, os.Stderr
	if err := demo.Install(ctx, c, manifest, &opts); err != nil {
		return err
	}
	if cfg.engine != "" {
		if err := ebbrun.UpdateLBArgs(ctx, c, func(args []string) []string { return append(args, "--engine="+cfg.engine) }); err != nil {
			return err
		}
	}
	cl, err := client.NewWithWatch(c.Config, client.Options{Scheme: demo.Scheme()})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench-faults: seed %d\n", cfg.seed)
	rng := rand.New(rand.NewPCG(cfg.seed, 0))
	b := &bench{c: c, cl: cl, opts: opts, lbHost: c.Nodes[0].Name}

	baseline := b.runOnce(ctx, 0, nil, 0)
	var results []outcome
	for i, f := range cfg.faults {
		at := moment(rng, cfg.window)
		results = append(results, b.runOnce(ctx, i+1, &f, at))
	}
	summary := map[string]any{
		"date": time.Now().UTC().Format(time.RFC3339), "nodes": benchcluster.NodesKind(true), "seed": cfg.seed, "engine": engineName(cfg.engine),
		"rate_per_second": cfg.rate, "long_lived": cfg.longLived, "window_s": cfg.window.Seconds(),
		"baseline_failed_requests": baseline.FailedRequests, "baseline_reset_connections": baseline.ResetConnections,
		"baseline_violations": baseline.Violations, "baseline": baseline, "faults": results,
	}
	return report.WriteSummary(cfg.out, summary)
}

func engineName(e string) string {
	if e == "" {
		return "Proxy"
	}
	return e
}

type bench struct {
	c      *localcluster.Cluster
	cl     client.WithWatch
	opts   demo.Options
	lbHost string
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[faults] "+format+"\n", args...)
}

// runOnce runs the scenario with f injected at after the drain started
// (nil: no fault), then checks what it left.
func (b *bench) runOnce(ctx context.Context, i int, f *fault, at time.Duration) outcome {
	name := "none"
	if f != nil {
		name = f.name
	}
	out := outcome{Fault: name, AtS: at.Seconds()}
	o := b.opts
	o.Namespace = fmt.Sprintf("faults-%d", i)
	if f != nil {
		b.logf("%s: %s, %.1f s into the drain", f.name, f.about, at.Seconds())
		o.DuringDrain = func(ctx context.Context, node string) {
			sleep(ctx, at)
			env := &faultEnv{c: b.c, lbHost: b.lbHost, drained: node, logf: b.logf}
			if err := f.inject(ctx, env); err != nil {
				out.Error = "injecting: " + err.Error()
				b.logf("%s: %v", f.name, err)
				return // no fault, or half of one: nothing to converge from
			}
			env.need.since = time.Now()
			took, missing := waitWhole(ctx, b.c, b.cl, env.need, 5*time.Minute)
			if missing != "" {
				out.ViolationList = append(out.ViolationList, fmt.Sprintf("not whole %s after the fault: %s", took.Round(time.Second), missing))
				return
			}
			s := float64(took.Milliseconds()) / 1000
			out.ConvergeS = &s
			b.logf("%s: whole again %.1f s after the fault", f.name, s)
		}
	}
	res, err := demo.Run(ctx, b.c, o)
	if err != nil {
		if out.Error != "" {
			out.Error += "; "
		}
		out.Error += "the scenario: " + err.Error()
		b.logf("%s: the scenario failed: %v", name, err)
	} else {
		out.Requests, out.FailedRequests, out.ResetConnections = res.RequestsSent, res.RequestsFailed, res.ResetConnections
		if res.RequestsSent > 0 {
			out.FailedRatio = float64(res.RequestsFailed) / float64(res.RequestsSent)
		}
	}
	out.ViolationList = append(out.ViolationList, b.leftHalfDone(ctx, o.Namespace)...)
	out.Violations = len(out.ViolationList)
	b.logf("%s: %d of %d requests failed, %d long-lived connections reset, %d violations %v", name, out.FailedRequests, out.Requests, out.ResetConnections, out.Violations, out.ViolationList)
	return out
}

// leftHalfDone lists what the run left half done: the end state a minute
// after the scenario (what is still wrong then), objects written in a
// loop, and maintenances or a namespace that do not go when deleted.
func (b *bench) leftHalfDone(ctx context.Context, ns string) []string {
	var v []string
	for deadline := time.Now().Add(time.Minute); ; {
		if v = endState(ctx, b.cl, ns); len(v) == 0 || time.Now().After(deadline) {
			break
		}
		sleep(ctx, time.Second)
	}
	loops, err := writeLoops(ctx, b.cl, 20*time.Second, 4)
	if err != nil {
		v = append(v, err.Error())
	}
	v = append(v, loops...)
	v = append(v, released(ctx, b.cl, time.Minute)...)
	if err := benchcluster.DeleteNamespace(ctx, b.c, ns); err != nil {
		v = append(v, err.Error())
	}
	return v
}
