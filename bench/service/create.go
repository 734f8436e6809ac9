package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/stats"
)

// slowFirstRequest is when a Service's first answer counts as slow enough
// to say why: the goal is under a second from the create.
const slowFirstRequest = time.Second

// series is n Services created one after another, each timed from its
// create to its first answer.
type series struct {
	n                 int
	served, addressed []time.Duration
	firstFailed       map[string]int
	slow              int
}

// createSeries creates n LoadBalancer Services of ebb's class named
// prefix-<i> in front of the app, one after another, and times each
// (createToFirstRequest). In pod mode (KEP-1864: no node ports) ebb lb
// sends traffic to the pods; in node mode through every node's node port,
// which each node's kube-proxy must program first. It prints the figures,
// and for every Service slower than slowFirstRequest what its failed
// attempts were.
func createSeries(ctx context.Context, c *localcluster.Cluster, ns, prefix string, n int, podMode bool) (series, error) {
	mode := "node mode"
	if podMode {
		mode = "pod mode"
	}
	s := series{n: n, firstFailed: map[string]int{}}
	for i := range n {
		svc := localcluster.EchoService(ns, fmt.Sprintf("%s-%d", prefix, i), corev1.ServiceTypeLoadBalancer)
		svc.Spec.Selector = map[string]string{"app": "app"}
		svc.Spec.LoadBalancerClass = ptr.To(lbmodel.ClassL4)
		if podMode {
			svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
		}
		r, err := createToFirstRequest(ctx, c, svc)
		if err != nil {
			return s, err
		}
		s.served, s.addressed = append(s.served, r.served), append(s.addressed, r.addressed)
		if r.firstErr != "" {
			s.firstFailed[errorKind(r.firstErr)]++
		}
		if r.served >= slowFirstRequest {
			s.slow++
			fmt.Fprintf(os.Stderr, "  %s (%s): address after %s, first answer after %s; failed before it: %s\n",
				svc.Name, mode, r.addressed.Round(time.Millisecond), r.served.Round(time.Millisecond), r.failures())
		}
	}
	fmt.Fprintf(os.Stderr, "%s: create to first request over %d Services: p50 %s p99 %s (to an address in the status: p50 %s p99 %s); %d took %s or more\n", mode, n,
		stats.Percentile(s.served, 0.5), stats.Percentile(s.served, 0.99), stats.Percentile(s.addressed, 0.5), stats.Percentile(s.addressed, 0.99), s.slow, slowFirstRequest)
	fmt.Fprintf(os.Stderr, "%s: first request the moment the status showed the address failed for %d of %d Services: %v\n", mode, total(s.firstFailed), n, s.firstFailed)
	return s, nil
}

// summarize adds the series' figures to the JSON summary, their keys
// prefixed.
func (s series) summarize(summary map[string]any, prefix string) {
	summary[prefix+"create_to_first_request_ms_p50"] = ms(stats.Percentile(s.served, 0.5))
	summary[prefix+"create_to_first_request_ms_p99"] = ms(stats.Percentile(s.served, 0.99))
	summary[prefix+"create_to_address_ms_p50"] = ms(stats.Percentile(s.addressed, 0.5))
	summary[prefix+"create_to_address_ms_p99"] = ms(stats.Percentile(s.addressed, 0.99))
	summary[prefix+"first_request_failed"] = total(s.firstFailed)
	summary[prefix+"first_request_failed_timeout"] = s.firstFailed["timeout"]
	summary[prefix+"first_request_slow"] = s.slow
}

// created is when a Service created by createToFirstRequest had an
// address in its status, and answered through it, after the create.
type created struct {
	addressed, served time.Duration
	url               string
	// firstErr is why the first request after the address showed in the
	// status failed ("" if it did not).
	firstErr string
	// failed counts the failed requests before the first answer by kind
	// (errorKind), and lastFailure is when the last one was sent.
	failed      map[string]int
	lastFailure time.Duration
}

// failures says what failed before the first answer.
func (r created) failures() string {
	if len(r.failed) == 0 {
		return "nothing"
	}
	var parts []string
	for kind, n := range r.failed {
		parts = append(parts, fmt.Sprintf("%d %s", n, kind))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%s, the last sent %s after the create", strings.Join(parts, ", "), r.lastFailure.Round(time.Millisecond))
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
	r := created{addressed: time.Since(start), url: "http://" + net.JoinHostPort(ip, "80") + "/", failed: map[string]int{}}
	// 3 s: longer than ebb lb holds a connection whose backends refuse
	// (1.5 s), so that a held request is not counted as a lost SYN.
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for first := true; ; first = false {
		sent := time.Since(start)
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
		r.failed[errorKind(err.Error())]++
		r.lastFailure = sent
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
