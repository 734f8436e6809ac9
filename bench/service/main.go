// Command service benchmarks Service load balancers on the local cluster
// with ebb installed from dist/install.yaml (ebb lb and the controller on
// an infrastructure node, the app on the other three): the time from
// creating a Service to its first successful request, and from an
// EndpointSlice change to the data plane following it. The last line printed
// is a JSON summary, also written to bench/results/service.json.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
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
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/internal/localcluster/podserver"
	"github.com/ebbdev/ebb/internal/stats"
)

func main() {
	dist := flag.String("dist", "dist", "where `make release` wrote install.yaml and the image layout oci, which the benchmark installs")
	services := flag.Int("services", 50, "Services to create for the create-to-first-request figure")
	updates := flag.Int("updates", 20, "endpoint changes to time")
	scaleN := flag.Int("scale", 1000, "Services (3 ports, 20 endpoints each) for the memory and resync figures; 0 skips")
	out := flag.String("out", "bench/results/service.json", "where to write the JSON summary")
	flag.Parse()
	benchcluster.Main("bench-service", false, func() error { return run(*dist, *services, *updates, *scaleN, *out) })
}

func run(dist string, nServices, nUpdates, nScale int, out string) error {
	ctx := context.Background()
	c, manifest, err := benchcluster.Start(ctx, "bench-service", dist, 4, false)
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
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, localcluster.EchoDeployment(ns, "app", 3), metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := c.WaitDeploymentAvailable(ctx, ns, "app", 2*time.Minute); err != nil {
		return err
	}

	var create, toAddress []time.Duration
	firstFailed := map[string]int{}
	for i := range nServices {
		svc := localcluster.EchoService(ns, fmt.Sprintf("svc-%d", i), corev1.ServiceTypeLoadBalancer)
		svc.Spec.Selector = map[string]string{"app": "app"}
		svc.Spec.LoadBalancerClass = ptr.To(lbmodel.ClassL4)
		r, err := createToFirstRequest(ctx, c, svc)
		if err != nil {
			return err
		}
		create, toAddress = append(create, r.served), append(toAddress, r.addressed)
		if r.firstErr != "" {
			firstFailed[errorKind(r.firstErr)]++
		}
	}
	fmt.Fprintf(os.Stderr, "create to first request over %d Services: p50 %s p99 %s (to an address in the status: p50 %s p99 %s)\n", nServices,
		stats.Percentile(create, 0.5), stats.Percentile(create, 0.99), stats.Percentile(toAddress, 0.5), stats.Percentile(toAddress, 0.99))
	fmt.Fprintf(os.Stderr, "first request the moment the status showed the address failed for %d of %d Services: %v\n", total(firstFailed), nServices, firstFailed)

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
		"date":                           time.Now().UTC().Format(time.RFC3339),
		"services":                       nServices,
		"create_to_first_request_ms_p50": ms(stats.Percentile(create, 0.5)),
		"create_to_first_request_ms_p99": ms(stats.Percentile(create, 0.99)),
		"create_to_address_ms_p50":       ms(stats.Percentile(toAddress, 0.5)),
		"create_to_address_ms_p99":       ms(stats.Percentile(toAddress, 0.99)),
		"first_request_failed":           total(firstFailed),
		"first_request_failed_timeout":   firstFailed["timeout"],
		"endpoint_update_ms_p50":         ms(stats.Percentile(updatesTimes, 0.5)),
		"endpoint_update_ms_p99":         ms(stats.Percentile(updatesTimes, 0.99)),
		"sync_ms_mean_small":             syncMs,
		"scale_services":                 sc.services,
		"scale_endpoints":                sc.endpoints,
		"lb_memory_mib_1000_services":    sc.memoryMiB,
		"full_resync_ms":                 sc.fullResyncMs,
		"scale_all_served_s":             sc.readyAfter.Seconds(),
	}
	return report.WriteSummary(out, summary)
}

// created is when a Service created by createToFirstRequest had an
// address in its status, and answered through it, after the create.
type created struct {
	addressed, served time.Duration
	url               string
	// firstErr is why the first request after the address showed in the
	// status failed ("" if it did not).
	firstErr string
}

// createToFirstRequest creates a LoadBalancer Service and times until its
// status has an address and until a request through that address
// succeeds.
func createToFirstRequest(ctx context.Context, c *localcluster.Cluster, svc *corev1.Service) (created, error) {
	ns, name := svc.Namespace, svc.Name
	start := time.Now()
	if _, err := c.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return created{}, err
	}
	var ip string
	for ip == "" {
		if time.Since(start) > time.Minute {
			return created{}, fmt.Errorf("%s got no address within a minute", name)
		}
		s, err := c.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && len(s.Status.LoadBalancer.Ingress) > 0 {
			ip = s.Status.LoadBalancer.Ingress[0].IP
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	r := created{addressed: time.Since(start), url: "http://" + net.JoinHostPort(ip, "80") + "/"}
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for first := true; ; first = false {
		resp, err := client.Get(r.url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				r.served = time.Since(start)
				return r, nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		if first {
			r.firstErr = err.Error()
		}
		if time.Since(start) > time.Minute {
			return created{}, fmt.Errorf("no answer through %s within a minute", r.url)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// errorKind sorts a failed request's error: a timeout (a lost SYN, or a
// backend that did not answer), a reset (the LB had no backend yet), or
// another.
func errorKind(msg string) string {
	switch {
	case strings.Contains(msg, "Client.Timeout") || strings.Contains(msg, "timeout"):
		return "timeout"
	case strings.Contains(msg, "reset by peer") || strings.Contains(msg, "EOF"):
		return "reset"
	case strings.Contains(msg, "refused"):
		return "refused"
	}
	return "other"
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// endpointUpdates times, n times, from the moment the EndpointSlice of a
// single-pod Service (pod mode) lists a replacement pod as ready to the
// first request through the load balancer that the new pod answers.
func endpointUpdates(ctx context.Context, c *localcluster.Cluster, ns string, n int) ([]time.Duration, error) {
	const name = "moving"
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, localcluster.EchoDeployment(ns, name, 1), metav1.CreateOptions{}); err != nil {
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
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
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
			resp, err := client.Get(url)
			if err != nil {
				continue
			}
			var id podserver.Identity
			_ = json.NewDecoder(resp.Body).Decode(&id)
			resp.Body.Close()
			if id.Pod == newPod {
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
