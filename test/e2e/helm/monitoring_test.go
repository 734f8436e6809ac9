package helm_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/internal/localcluster/network"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// The scraper's service account (monitoring.metricsReader) and one that
// was granted nothing.
const (
	monitoringNamespace = "monitoring"
	scraper             = "prometheus"
	stranger            = "nobody"
)

// monitoringValues are the chart's values that turn on the ServiceMonitor,
// the alert rules and the scraper's binding.
var monitoringValues = "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true,monitoring.dashboards.enabled=true,monitoring.metricsReader=" + monitoringNamespace + "/" + scraper

// installMonitoringCRDs installs the Prometheus operator's ServiceMonitor
// and PrometheusRule CRDs (hack/monitoring-crds.sh generates them from
// its API types), so that the chart's objects are checked against their
// schemas, and makes the scraper's service accounts.
func installMonitoringCRDs(t *testing.T, ctx context.Context) {
	t.Helper()
	out, err := exec.CommandContext(ctx, "../../../hack/monitoring-crds.sh", filepath.Join(cluster.BinDir, "controller-gen")).Output()
	if err != nil {
		t.Fatalf("generating the Prometheus operator's CRDs (hack/monitoring-crds.sh): %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := lines[len(lines)-1]
	for _, f := range []string{"monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml"} {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := ebbrun.ApplyYAML(ctx, cluster, strings.TrimSuffix(f, ".yaml"), string(data)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: monitoringNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{scraper, stranger} {
		if _, err := cluster.Client.CoreV1().ServiceAccounts(monitoringNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The CRDs are served before helm applies their objects.
	e2eutil.Eventually(t, ctx, 30*time.Second, "the ServiceMonitor API served", func(ctx context.Context) (bool, string) {
		_, err := cluster.Client.Discovery().ServerResourcesForGroupVersion("monitoring.coreos.com/v1")
		return err == nil, fmt.Sprint(err)
	})
}

// checkScrapes does what Prometheus does with the chart's ServiceMonitor:
// it finds each component's endpoints through its Service and gets
// /metrics over HTTPS with the scraper's token (from another node, as a
// Prometheus pod would), and checks that the components refuse a caller
// without a token and one the API server does not authorize.
func checkScrapes(t *testing.T, ctx context.Context) {
	t.Helper()
	from, ok := cluster.Network.Host(cluster.Nodes[len(cluster.Nodes)-1].Name)
	if !ok {
		t.Fatal("no host for the last node")
	}
	allowed, refused := serviceAccountToken(t, ctx, scraper), serviceAccountToken(t, ctx, stranger)
	for _, svc := range []struct {
		name, metric string
		endpoints    int
	}{
		{"ebb-controller-metrics", "ebb_webhook_certificate_expiry_timestamp_seconds", 2},
		{"ebb-lb-metrics", "ebb_lb_api_cut_off", 1},
		{"ebb-node-agent-metrics", "ebb_node_state_known", len(cluster.Nodes)},
	} {
		var targets []string
		e2eutil.Eventually(t, ctx, time.Minute, fmt.Sprintf("%d ready endpoints of Service %s", svc.endpoints, svc.name), func(ctx context.Context) (bool, string) {
			targets = serviceTargets(ctx, svc.name)
			return len(targets) == svc.endpoints, fmt.Sprint(targets)
		})
		for _, target := range targets {
			var body string
			e2eutil.Eventually(t, ctx, 30*time.Second, "scraping "+svc.name+" at "+target, func(ctx context.Context) (bool, string) {
				code, b, err := scrape(ctx, from, target, allowed)
				body = b
				return err == nil && code == http.StatusOK, fmt.Sprintf("%d %v %.200s", code, err, b)
			})
			if !strings.Contains(body, svc.metric) {
				t.Errorf("%s at %s: no %s in its metrics", svc.name, target, svc.metric)
			}
			for _, c := range []struct {
				who, token string
				want       int
			}{{"no token", "", http.StatusUnauthorized}, {"a service account without ebb-metrics-reader", refused, http.StatusForbidden}} {
				if code, b, err := scrape(ctx, from, target, c.token); err != nil || code != c.want {
					t.Errorf("%s at %s with %s: %d %v, want %d: %.200s", svc.name, target, c.who, code, err, c.want, b)
				}
			}
		}
		t.Logf("%s: %d endpoints scraped with the scraper's token; refused without one and to a service account without the role", svc.name, len(targets))
	}
}

// serviceAccountToken is a 10-minute token of service account sa of the
// monitoring namespace, as its pod would be given.
func serviceAccountToken(t *testing.T, ctx context.Context, sa string) string {
	t.Helper()
	tr, err := cluster.Client.CoreV1().ServiceAccounts(monitoringNamespace).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// serviceTargets are the ready address:port pairs of a Service of ebb's
// namespace, from its EndpointSlices, as the Prometheus operator reads them.
func serviceTargets(ctx context.Context, service string) []string {
	slices, err := cluster.Client.DiscoveryV1().EndpointSlices(ebbrun.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range slices.Items {
		for _, p := range s.Ports {
			if ptr.Deref(p.Name, "") != "https-metrics" || p.Port == nil {
				continue
			}
			for _, e := range s.Endpoints {
				if !ptr.Deref(e.Conditions.Ready, false) {
					continue
				}
				for _, a := range e.Addresses {
					out = append(out, net.JoinHostPort(a, fmt.Sprint(*p.Port)))
				}
			}
		}
	}
	return out
}

// scrape gets https://target/metrics from inside host's network namespace
// with token (none if empty), skipping the self-signed certificate's
// verification as the ServiceMonitor does.
func scrape(ctx context.Context, host *network.Host, target, token string) (int, string, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			return host.DialContext(ctx, network, address)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+target+"/metrics", nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}
