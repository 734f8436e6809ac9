// Command service benchmarks Service load balancers on the local cluster
// with ebb installed from dist/install.yaml (ebb lb and the controller on
// an infrastructure node, the app on the other three): the time from
// creating a Service to its first successful request, in node mode
// (through every node's node port) and in pod mode (KEP-1864, no node
// ports), and from an EndpointSlice change to the data plane following it;
// then one ebb lb's memory and resync time with 1,000 Services. The last
// line printed is a JSON summary, also written to
// bench/results/service.json.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/bench/internal/benchcluster"
	"github.com/ebbdev/ebb/bench/internal/report"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/appclient"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/internal/stats"
)

func main() {
	dist := flag.String("dist", "dist", "where `make release` wrote install.yaml and the image layout oci, which the benchmark installs")
	services := flag.Int("services", 50, "Services to create for the create-to-first-request figure")
	updates := flag.Int("updates", 20, "endpoint changes to time")
	scaleN := flag.Int("scale", 1000, "Services (3 ports, 20 endpoints each) for the memory and resync figures; 0 skips")
	kubeProxyMinSync := benchcluster.KubeProxyMinSyncPeriodFlag()
	realKubelets := flag.Bool("real-kubelets", false, "real nodes: the upstream kubelet and containerd, the app agnhost (root only; docs/local-cluster.md)")
	out := flag.String("out", "bench/results/service.json", "where to write the JSON summary")
	flag.Parse()
	benchcluster.Main("bench-service", *realKubelets, func() error { return run(*dist, *services, *updates, *scaleN, *realKubelets, *kubeProxyMinSync, *out) })
}

func run(dist string, nServices, nUpdates, nScale int, realKubelets bool, kubeProxyMinSync time.Duration, out string) error {
	ctx := context.Background()
	c, manifest, err := benchcluster.Start(ctx, dist, localcluster.Options{Name: "bench-service", Nodes: 4, RealKubelets: realKubelets, KubeProxyMinSyncPeriod: kubeProxyMinSync})
	if err != nil {
		return err
	}
	defer c.Stop()
	lbNode := c.Nodes[len(c.Nodes)-1]
	if err := ebbrun.InstallOnNode(ctx, c, manifest, lbNode); err != nil {
		return err
	}
	lb := lbReader{c: c, node: lbNode}

	const ns = metav1.NamespaceDefault
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, c.AppDeployment(ns, "app", 3), metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := c.WaitDeploymentAvailable(ctx, ns, "app", 2*time.Minute); err != nil {
		return err
	}

	nodeMode, err := createSeries(ctx, c, ns, "svc", nServices, false)
	if err != nil {
		return err
	}
	podMode, err := createSeries(ctx, c, ns, "pod-svc", nServices, true)
	if err != nil {
		return err
	}

	updatesTimes, err := endpointUpdates(ctx, c, ns, nUpdates)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "EndpointSlice change to data plane over %d changes: p50 %s p99 %s\n", nUpdates, stats.Percentile(updatesTimes, 0.5), stats.Percentile(updatesTimes, 0.99))

	syncMs, frontends, err := lb.syncFigures(ctx)
	if err != nil {
		return err
	}
	var sc scaleResult
	if nScale > 0 {
		fmt.Fprintf(os.Stderr, "creating %d Services of 3 ports with 20 endpoints each\n", nScale)
		if sc, err = scale(ctx, c, lb, ns, nScale, 20, frontends); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "ebb lb with %d Services and %d endpoints: %.0f MiB resident, full resync %.1f ms, all served %s after the first create\n",
			sc.services, sc.endpoints, sc.memoryMiB, sc.fullResyncMs, sc.readyAfter.Round(time.Second))
	}
	summary := map[string]any{
		"date":                          time.Now().UTC().Format(time.RFC3339),
		"nodes":                         benchcluster.NodesKind(realKubelets),
		"services":                      nServices,
		"endpoint_update_ms_p50":        ms(stats.Percentile(updatesTimes, 0.5)),
		"endpoint_update_ms_p99":        ms(stats.Percentile(updatesTimes, 0.99)),
		"sync_ms_mean_small":            syncMs,
		"scale_services":                sc.services,
		"scale_endpoints":               sc.endpoints,
		"lb_memory_mib_1000_services":   sc.memoryMiB,
		"full_resync_ms":                sc.fullResyncMs,
		"scale_all_served_s":            sc.readyAfter.Seconds(),
		"kube_proxy_min_sync_period_ms": kubeProxyMinSync.Milliseconds(),
	}
	nodeMode.summarize(summary, "")
	podMode.summarize(summary, "pod_mode_")
	return report.WriteSummary(out, summary)
}

// endpointUpdates times, n times, from the moment the EndpointSlice of a
// single-pod Service (pod mode) lists a replacement pod as ready to the
// first request through the load balancer that the new pod answers.
func endpointUpdates(ctx context.Context, c *localcluster.Cluster, ns string, n int) ([]time.Duration, error) {
	const name = "moving"
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, c.AppDeployment(ns, name, 1), metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if err := c.WaitDeploymentAvailable(ctx, ns, name, 2*time.Minute); err != nil {
		return nil, err
	}
	svc := localcluster.EchoService(ns, name, corev1.ServiceTypeLoadBalancer)
	svc.Spec.LoadBalancerClass = ptr.To(lbmodel.ClassL4)
	svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	r, err := createToFirstRequest(ctx, c, svc)
	if err != nil {
		return nil, err
	}
	url := r.url
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var out []time.Duration
	for range n {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err != nil || len(pods.Items) == 0 {
			return nil, fmt.Errorf("listing the pod: %v", err)
		}
		// Pod IPs are recycled, so pods are told apart by name.
		old := map[string]bool{}
		for _, p := range pods.Items {
			old[p.Name] = true
			if err := c.Client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](1)}); err != nil {
				return nil, err
			}
		}
		// Wait for the slice to list a new ready endpoint.
		var newPod string
		var sliceAt time.Time
		for deadline := time.Now().Add(time.Minute); newPod == ""; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("no replacement endpoint within a minute")
			}
			slices, err := c.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
			if err != nil {
				continue
			}
			for _, sl := range slices.Items {
				for _, ep := range sl.Endpoints {
					if ep.TargetRef != nil && !old[ep.TargetRef.Name] && ptr.Deref(ep.Conditions.Ready, true) {
						newPod, sliceAt = ep.TargetRef.Name, time.Now()
					}
				}
			}
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("the load balancer never sent traffic to the new pod %s", newPod)
			}
			pod, err := appclient.AnsweringPod(ctx, client, c.RealKubelets(), url)
			if err == nil && pod == newPod {
				out = append(out, time.Since(sliceAt))
				break
			}
		}
	}
	return out, nil
}

// lbReader reads the metrics of the ebb lb on node.
type lbReader struct {
	c    *localcluster.Cluster
	node localcluster.Node
}

// metrics scrapes ebb lb's unlabelled series once.
func (r lbReader) metrics(ctx context.Context) (map[string]float64, error) {
	page, err := ebbrun.LBPage(ctx, r.c, r.node, "/metrics")
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, l := range strings.Split(page, "\n") {
		if f := strings.Fields(l); len(f) == 2 && !strings.HasPrefix(l, "#") && !strings.Contains(f[0], "{") {
			v, _ := strconv.ParseFloat(f[1], 64)
			out[f[0]] = v
		}
	}
	return out, nil
}

// syncFigures reads ebb lb's mean full-sync time and frontend count.
func (r lbReader) syncFigures(ctx context.Context) (float64, float64, error) {
	m, err := r.metrics(ctx)
	if err != nil {
		return 0, 0, err
	}
	sum, count := m["ebb_lbsync_sync_duration_seconds_sum"], m["ebb_lbsync_sync_duration_seconds_count"]
	mean := 0.0
	if count > 0 {
		mean = sum / count * 1000
	}
	return mean, m["ebb_lbsync_frontends"], nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
