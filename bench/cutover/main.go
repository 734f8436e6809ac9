// Command cutover measures how fast a leaving node stops getting new
// connections, on the local cluster with ebb installed from
// dist/install.yaml (ebb lb and the controller on a fourth, infrastructure
// node) and a client opening new connections at a constant rate through a
// node-mode LoadBalancer Service whose pods run on the other three:
//
//   - cutover: the out-of-service taint is added at t0; the figures are
//     the time of the last new connection the node accepted, minus t0
//     (which cannot resolve less than the mean gap between the node's new
//     connections, reported beside it), and the time `ebb lb` itself
//     stamps on applying Down (metric
//     ebb_lb_admin_state_applied_timestamp_seconds), minus t0;
//   - spot eviction: a PreemptScheduled Event is created at t0 and the
//     node's data path is killed at t0 + 2 s; the figure is the number of
//     failed requests. The same runs with admin state switched off
//     (ebb lb rolled out with --disable-admin-state: only the probes
//     decide, every 5 s, 2 failures) are the baseline, and give the
//     probe-only cutover.
//
// The last line printed is a JSON summary, also written to
// bench/results/cutover.json.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/bench/internal/benchcluster"
	"github.com/ebbdev/ebb/bench/internal/report"
	"github.com/ebbdev/ebb/internal/demo"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/internal/stats"
)

func main() {
	dist := flag.String("dist", "dist", "where `make release` wrote install.yaml and the image layout oci, which the benchmark installs")
	runs := flag.Int("runs", 20, "cutover runs (the out-of-service taint)")
	spotRuns := flag.Int("spot-runs", 3, "spot-eviction runs, each with ebb and with the probe-only baseline")
	rate := flag.Int("rate", 500, "new connections per second")
	out := flag.String("out", "bench/results/cutover.json", "where to write the JSON summary")
	realKubelets := flag.Bool("real-kubelets", false, "real nodes: the upstream kubelet and containerd, the app agnhost (root only; docs/local-cluster.md)")
	flag.Parse()
	benchcluster.Main("bench-cutover", *realKubelets, func() error { return run(*dist, *runs, *spotRuns, *rate, *realKubelets, *out) })
}

const ns = metav1.NamespaceDefault

func run(dist string, runs, spotRuns, rate int, realKubelets bool, out string) error {
	ctx := context.Background()
	c, manifest, err := benchcluster.Start(ctx, dist, localcluster.Options{Name: "bench-cutover", Nodes: 4, RealKubelets: realKubelets})
	if err != nil {
		return err
	}
	defer c.Stop()
	lbNode := c.Nodes[len(c.Nodes)-1]
	if err := ebbrun.InstallOnNode(ctx, c, manifest, lbNode); err != nil {
		return err
	}
	url, err := deploy(ctx, c)
	if err != nil {
		return err
	}
	svc, err := c.Client.CoreV1().Services(ns).Get(ctx, "app", metav1.GetOptions{})
	if err != nil {
		return err
	}
	// The traffic's node port: the Local Service's health check node port
	// is probed even while the node is Down, and must not count.
	b := &bench{c: c, lbNode: lbNode, nodes: c.Nodes[:len(c.Nodes)-1], nodePort: svc.Spec.Ports[0].NodePort,
		load: &loadgen.Requests{URL: url, Rate: rate, Timeout: requestTimeout}}
	b.load.Start()
	defer b.load.Stop()

	cutovers, err := b.cutovers(ctx, runs)
	if err != nil {
		return err
	}
	// A node gets a new connection every len(nodes)/rate on average: the
	// last-connection figure cannot resolve anything shorter. The data
	// plane's own timestamp has no such limit.
	resolution := time.Duration(float64(time.Second) * float64(len(b.nodes)) / float64(rate))
	fmt.Fprintf(os.Stderr, "cutover over %d runs at %d conn/s: last new connection p50 %s p99 %s (resolution %s: the mean gap between a node's new connections); taint write to Down applied p50 %s p99 %s\n",
		runs, rate, stats.Percentile(cutovers, 0.5), stats.Percentile(cutovers, 0.99), resolution,
		stats.Percentile(b.apiToApplied, 0.5), stats.Percentile(b.apiToApplied, 0.99))
	fmt.Fprintf(os.Stderr, "of which the API write p50 %s p99 %s, ebb lb's informer event to Down applied p50 %s p99 %s\n",
		stats.Percentile(b.write, 0.5), stats.Percentile(b.write, 0.99),
		stats.Percentile(b.observedToApplied, 0.5), stats.Percentile(b.observedToApplied, 0.99))
	spotFailed, _, err := b.spotRuns(ctx, spotRuns)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "spot eviction with ebb: %d failed requests over %d runs\n", spotFailed, spotRuns)

	if err := demo.SetBaseline(ctx, c, true); err != nil {
		return err
	}
	if err := b.waitAllNodesServe(ctx); err != nil {
		return err
	}
	baseFailed, probeCutovers, err := b.spotRuns(ctx, spotRuns)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "spot eviction, probe-only baseline: %d failed requests over %d runs; cutover p50 %s\n", baseFailed, spotRuns, stats.Percentile(probeCutovers, 0.5))

	p50, probeP50 := stats.Percentile(cutovers, 0.5), stats.Percentile(probeCutovers, 0.5)
	speedup := 0.0
	if p50 > 0 {
		speedup = float64(probeP50) / float64(p50)
	}
	sent, _ := b.load.Counts()
	summary := map[string]any{
		"date":                          time.Now().UTC().Format(time.RFC3339),
		"nodes":                         benchcluster.NodesKind(realKubelets),
		"runs":                          runs,
		"spot_runs":                     spotRuns,
		"rate_per_second":               rate,
		"requests_sent":                 sent,
		"cutover_ms_p50":                ms(p50),
		"cutover_ms_p99":                ms(stats.Percentile(cutovers, 0.99)),
		"cutover_resolution_ms":         ms(resolution),
		"api_to_applied_ms_p50":         ms(stats.Percentile(b.apiToApplied, 0.5)),
		"api_to_applied_ms_p99":         ms(stats.Percentile(b.apiToApplied, 0.99)),
		"api_write_ms_p50":              ms(stats.Percentile(b.write, 0.5)),
		"api_write_ms_p99":              ms(stats.Percentile(b.write, 0.99)),
		"observed_to_applied_ms_p50":    ms(stats.Percentile(b.observedToApplied, 0.5)),
		"observed_to_applied_ms_p99":    ms(stats.Percentile(b.observedToApplied, 0.99)),
		"probe_only_cutover_ms_p50":     ms(probeP50),
		"cutover_speedup_vs_probe":      float64(int(speedup*10)) / 10,
		"spot_failed_requests":          spotFailed,
		"baseline_spot_failed_requests": baseFailed,
	}
	return report.WriteSummary(out, summary)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// deploy creates the app (3 replicas, one per app node, tolerating the
// out-of-service taint so the measurement is about the load balancer, not
// pod churn) and its node-mode LoadBalancer Service with
// externalTrafficPolicy Local, and returns the Service's URL once it
// answers. Local, because a vanished node takes its pods with it: with
// Cluster, the other nodes' kube-proxies keep forwarding a share of every
// node's connections to those pods until Kubernetes notices, which no
// load balancer in front of the nodes can change (docs/benchmarks.md).
func deploy(ctx context.Context, c *localcluster.Cluster) (string, error) {
	dep := c.AppDeployment(ns, "app", 3)
	dep.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Key: lbmodel.TaintOutOfService, Operator: corev1.TolerationOpExists}}
	dep.Spec.Template.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "app"}},
			TopologyKey:   corev1.LabelHostname,
		}},
	}}
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if err := c.WaitDeploymentAvailable(ctx, ns, "app", 2*time.Minute); err != nil {
		return "", err
	}
	svc := localcluster.EchoService(ns, "app", corev1.ServiceTypeLoadBalancer)
	svc.Spec.LoadBalancerClass = ptr.To(lbmodel.ClassL4)
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	if _, err := c.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if err := c.WaitServiceEndpoints(ctx, ns, "app", 3, time.Minute); err != nil {
		return "", err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		s, err := c.Client.CoreV1().Services(ns).Get(ctx, "app", metav1.GetOptions{})
		if err == nil && len(s.Status.LoadBalancer.Ingress) > 0 {
			url := "http://" + net.JoinHostPort(s.Status.LoadBalancer.Ingress[0].IP, "80") + "/"
			if (&loadgen.Requests{URL: url}).Probe() == nil {
				return url, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the Service did not answer within a minute")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
