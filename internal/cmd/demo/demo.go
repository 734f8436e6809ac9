// Package demo implements `ebb demo`, ebb's main job on the embedded local
// cluster: two apps behind ebb load balancers take constant traffic while
// a node is drained with a NodeMaintenance, taken down for its maintenance
// and brought back; the report says what the clients noticed. --baseline
// runs the same scenario the way clusters do it today, side by side.
package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ebbdev/ebb/internal/cmd/cluster"
	"github.com/ebbdev/ebb/internal/demo"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// Options are the demo's flags.
type Options struct {
	Nodes int
	// RealKubelets makes the nodes real (kubelet, containerd, agnhost apps).
	RealKubelets bool
	Scenario     demo.Options
	Baseline     bool
	Short        bool
	Keep         bool
	JSON         bool
	Report       string
	// StateDir is where --keep leaves the cluster for `ebb cluster exec`.
	StateDir string
	// ToolsBin holds the control-plane binaries (default:
	// localcluster.FindBinDir).
	ToolsBin string
	// LBHost also maintains an LB host (demo.RunLBHost).
	LBHost bool
	// Install is the manifest ebb is installed from (`make release`
	// writes dist/install.yaml); the image layout is the oci directory
	// next to it.
	Install string
}

// keepName is the cluster name --keep registers.
const keepName = "demo"

// NewCommand returns `ebb demo`.
func NewCommand() *cobra.Command {
	o := &Options{Scenario: demo.DefaultOptions()}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Drain a node of a local cluster under live traffic with ebb, and report what the clients noticed",
		Long: `Starts a local cluster (building what is missing) whose nodes are real (the
upstream kubelet and containerd on each; --real-kubelets=false: kwok-simulated
nodes, pods of ebb's image as processes, the apps echo servers), installs
ebb in it from dist/install.yaml as a user does (two controller replicas,
the ebb lb DaemonSet on the first node), deploys a Deployment of several replicas and a single
replica that uses the surge evacuator, both behind ebb.dev/l4 LoadBalancer
Services, sends constant HTTP traffic through their addresses, drains the
single replica's node with a NodeMaintenance (the clients sit behind the
router, which reaches the addresses through the LB node), takes the node down for its
maintenance, brings it back and completes the maintenance. Prints a report
and writes a self-contained HTML report. Then it runs the scenario the way
clusters do it today (cordon, kubectl's drain library, a load balancer
driven by health probes only) and puts both side by side; --baseline=false
skips that run (about half the time). Last (--lb-host), it maintains a host
of the load balancer itself: ebb lb on two nodes announcing the address by
ARP (an AnnouncementPolicy), a NodeMaintenance of the one that owns it,
under traffic.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Report == "" {
				o.Report = "ebb-demo-report.html"
			}
			abs, err := filepath.Abs(o.Report)
			if err != nil {
				return err
			}
			o.Report = abs
			if o.Install, err = ebbrun.FindManifest(o.Install); err != nil {
				return err
			}
			if !localcluster.InNamespace() {
				reexec := localcluster.ReexecNotify
				if o.RealKubelets {
					reexec = localcluster.ReexecInHostUserNamespaceNotify
				}
				code, err := reexec(o.outside)
				if err != nil && o.RealKubelets {
					return fmt.Errorf("%w (ebb demo runs on real nodes unless --real-kubelets=false, which needs no root)", err)
				}
				if err != nil {
					return err
				}
				if code != 0 {
					return &cluster.ExitError{Code: code}
				}
				return nil
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return o.Run(ctx, os.Stdout)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Nodes, "nodes", 3, "number of nodes")
	f.BoolVar(&o.RealKubelets, "real-kubelets", true, "real nodes: the upstream kubelet and containerd on every node, the apps agnhost (needs root; false: kwok-simulated nodes, which need none; docs/local-cluster.md)")
	f.Int32Var(&o.Scenario.Replicas, "replicas", o.Scenario.Replicas, "replicas of the multi-replica app")
	f.IntVar(&o.Scenario.Rate, "rate", o.Scenario.Rate, "new connections per second through the load balancers")
	f.IntVar(&o.Scenario.LongLived, "long-lived", o.Scenario.LongLived, "long-lived connections kept open (each replaced every few seconds)")
	f.DurationVar(&o.Scenario.Downtime, "downtime", o.Scenario.Downtime, "how long the drained node is down for its maintenance")
	f.BoolVar(&o.Baseline, "baseline", true, "also run the scenario the way clusters do it today, and compare (false: ebb only, about half the time)")
	f.BoolVar(&o.Short, "short", false, "a quicker, lighter run (for CI)")
	f.BoolVar(&o.LBHost, "lb-host", true, "then maintain a host of the load balancer itself: ebb lb on two nodes announcing by ARP, a NodeMaintenance of the one that owns the address, under traffic")
	f.BoolVar(&o.Keep, "keep", false, "leave the cluster up afterwards (until Ctrl-C) and say how to look inside")
	f.BoolVar(&o.JSON, "json", false, "print a JSON summary as the last line")
	f.StringVar(&o.Report, "report", "", "where to write the HTML report (default ./ebb-demo-report.html)")
	f.StringVar(&o.StateDir, "state-dir", cluster.DefaultStateRoot(), "with --keep: the clusters' state directory of `ebb cluster`")
	f.StringVar(&o.Install, "install", "", "the manifest to install ebb from, with its image layout in the oci directory beside it (default: $EBB_DIST/install.yaml, else dist/install.yaml of the checkout this binary was built in; `make release` writes it)")
	f.StringVar(&o.ToolsBin, "tools-bin", "", "directory of the control-plane binaries `make tools` prints (default: $EBB_TOOLS_BIN, the checkout's hack/tools.sh, then the newest build in the tools cache)")
	return cmd
}

// outside runs in the calling process once the namespaced child started:
// with --keep it registers the child so `ebb cluster exec --name demo`
// finds it.
func (o *Options) outside(pid int) {
	if o.Keep {
		_ = cluster.RegisterPID(o.StateDir, keepName, pid)
	}
}

// Run runs the demo inside the private namespace.
func (o *Options) Run(ctx context.Context, out io.Writer) (retErr error) {
	if err := localcluster.SetupNamespace(); err != nil {
		return err
	}
	if o.Short {
		o.Scenario.Rate, o.Scenario.LongLived, o.Scenario.LongLivedLifetime = 60, 4, 2*time.Second
		o.Scenario.Settle, o.Scenario.Downtime, o.Scenario.Replicas = time.Second, 4*time.Second, 3
	}
	start := time.Now()
	copts := localcluster.Options{Name: "demo", Nodes: o.Nodes, BinDir: o.ToolsBin, Progress: out, RealKubelets: o.RealKubelets,
		Images: []string{filepath.Join(filepath.Dir(o.Install), "oci")}}
	if o.Keep {
		copts.Dir = filepath.Join(o.StateDir, keepName)
	}
	c, err := localcluster.Start(ctx, copts)
	if err != nil {
		return err
	}
	defer func() {
		if err := c.Stop(); err != nil && retErr == nil {
			retErr = err
		}
	}()
	results, lb, err := o.scenarios(ctx, c, out)
	if err != nil {
		return err
	}
	ebb := results[0]

	fmt.Fprintln(out)
	demo.WriteText(out, results...)
	if lb != nil {
		demo.WriteLBHostText(out, lb)
	}
	if err := demo.WriteHTML(o.Report, lb, results...); err != nil {
		return fmt.Errorf("writing the HTML report: %w", err)
	}
	fmt.Fprintf(out, "\n[demo] HTML report: %s\n[demo] done in %s\n", o.Report, time.Since(start).Round(100*time.Millisecond))
	if o.Keep {
		if err := cluster.MarkReady(filepath.Join(o.StateDir, keepName), c.BinDir); err != nil {
			return err
		}
		fmt.Fprintf(out, "[demo] the cluster stays up until Ctrl-C. Look inside from another terminal:\n"+
			"  ebb cluster exec --name %s -- kubectl get nodes,nodemaintenances,evacuations,loadbalancerreports -A\n"+
			"  ebb cluster exec --name %s -- kubectl get services -n demo-ebb\n", keepName, keepName)
		<-ctx.Done()
	}
	if o.JSON {
		summary := o.summary(results)
		if lb != nil {
			summary["lb_host_requests_sent"], summary["lb_host_requests_failed"] = lb.RequestsSent, lb.RequestsFailed
			summary["lb_host_reset_connections"], summary["lb_host_takeover_ms"] = lb.LongLivedBroken, lb.TakeoverMs
			summary["lb_host_drained_seconds"] = round(lb.DrainedSeconds)
		}
		line, _ := json.Marshal(summary)
		fmt.Fprintln(out, string(line))
	}
	if ebb.RequestsFailed > 0 || ebb.ResetConnections > 0 {
		// The failures' moments come last too: a log's tail is often all
		// one sees of a failed run.
		err := fmt.Errorf("ebb let %d requests fail and %d long-lived connections break", ebb.RequestsFailed, ebb.ResetConnections)
		if f := ebb.Failures(); f != "" {
			err = fmt.Errorf("%w: %s", err, f)
		}
		return err
	}
	if lb != nil && (lb.RequestsFailed > 0 || lb.LongLivedBroken > 0) {
		return fmt.Errorf("maintaining the LB host %s let %d requests fail and %d long-lived connections break", lb.Host, lb.RequestsFailed, lb.LongLivedBroken)
	}
	return nil
}

// scenarios installs ebb from the manifest with ebb lb on the first node,
// then runs ebb's scenario on the other nodes, then, with --baseline, the
// same with the load balancer's admin state off, then, with --lb-host, the
// maintenance of an LB host; ebb's result comes first.
func (o *Options) scenarios(ctx context.Context, c *localcluster.Cluster, out io.Writer) ([]*demo.Result, *demo.LBHostResult, error) {
	scenario := o.Scenario
	scenario.Progress, scenario.Namespace = out, "demo-ebb"
	fmt.Fprintf(out, "[demo] installing ebb from %s: ebb lb on %s, the router reaching the addresses through it\n", o.Install, c.Nodes[0].Name)
	if err := demo.Install(ctx, c, o.Install, &scenario); err != nil {
		return nil, nil, err
	}
	ebb, err := demo.Run(ctx, c, scenario)
	if err != nil {
		return nil, nil, err
	}
	results := []*demo.Result{ebb}
	if o.Baseline {
		fmt.Fprintln(out, "[demo] baseline: ebb lb rolling out with --disable-admin-state (health probes only)")
		if err := demo.SetBaseline(ctx, c, true); err != nil {
			return nil, nil, err
		}
		scenario.Baseline, scenario.Namespace = true, "demo-baseline"
		base, err := demo.Run(ctx, c, scenario)
		if err != nil {
			return nil, nil, err
		}
		results = append(results, base)
		fmt.Fprintln(out, "[demo] ebb lb rolling out with its admin state back on")
		if err := demo.SetBaseline(ctx, c, false); err != nil {
			return nil, nil, err
		}
	}
	if !o.LBHost {
		return results, nil, nil
	}
	lb, err := demo.RunLBHost(ctx, c, out)
	if err != nil {
		return nil, nil, fmt.Errorf("maintaining an LB host: %w", err)
	}
	return results, lb, nil
}

// summary is the --json line: ebb's figures, and the baseline's beside.
func (o *Options) summary(results []*demo.Result) map[string]any {
	ebb := results[0]
	summary := map[string]any{
		"requests_sent": ebb.RequestsSent, "requests_failed": ebb.RequestsFailed, "reset_connections": ebb.ResetConnections,
		"cutover_ms": ebb.CutoverMs, "drain_seconds": round(ebb.DrainSeconds), "p99_ms": ebb.P99Ms, "report_path": o.Report,
	}
	if len(results) > 1 {
		b := results[1]
		summary["baseline_requests_sent"], summary["baseline_requests_failed"] = b.RequestsSent, b.RequestsFailed
		summary["baseline_reset_connections"], summary["baseline_cutover_ms"] = b.ResetConnections, b.CutoverMs
		summary["baseline_drain_seconds"], summary["baseline_p99_ms"] = round(b.DrainSeconds), b.P99Ms
	}
	return summary
}

func round(v float64) float64 { return float64(int(v*10)) / 10 }
