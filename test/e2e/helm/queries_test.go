package helm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/ebbdev/ebb/internal/localcluster/network"
	"github.com/ebbdev/ebb/internal/metricsdoc"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// needsScenario are the metrics this test's cluster cannot produce (no
// series exist until what the reason says happens), so that a query or a
// rule reading only these may come back empty. Every other query must
// return series: a renamed metric or label, or a selector on a value
// ebb never writes, fails the test.
var needsScenario = map[string]string{
	"ebb_lb_bgp_session_up":                             "a BGPPeer (no router here)",
	"ebb_lb_bgp_announced_routes":                       "BGP (the gauge exists only with BGP on; no BGPPeer here)",
	"ebb_lb_l2_owned_addresses":                         "L2 announcement (lb.l2Interfaces)",
	"ebb_lb_l2_takeovers_total":                         "L2 announcement",
	"ebb_dataplane_refused_total":                       "a refused client connection",
	"ebb_dataplane_dial_errors_total":                   "a backend refusing a connection",
	"ebb_dataplane_frontend_skipped":                    "a frontend the data plane cannot serve",
	"ebb_lb_admin_state_transitions_total":              "a node leaving",
	"ebb_nodemaintenance_pods":                          "a NodeMaintenance with pods to evacuate",
	"ebb_evacuation_evictions_total":                    "an eviction",
	"ebb_nodemaintenance_stage_duration_seconds_bucket": "a NodeMaintenance changing stage",
	"ebb_lb_kernel_state_repairs_total":                 "the kernel engine's state removed by someone else",
	"ebb_dataplane_kernel_auto_fallback":                "engine Auto",
	"ebb_dataplane_bpf_map_elements":                    "the eBPF path",
	"ebb_dataplane_bpf_map_size":                        "the eBPF path",
	"ebb_dataplane_bpf_source_ports_exhausted_total":    "the eBPF path",
	"ebb_service_lb_sync_failures_total":                "a Service that cannot be given an address",
}

// evaluateQueries runs a real Prometheus in the last node's network
// namespace (where a Prometheus pod would be) that scrapes every endpoint
// of ebb's three metrics Services as the chart's ServiceMonitor says
// (HTTPS, the scraper's token, the certificate not verified) and loads
// ebb's alert rules; then it evaluates every dashboard query and every
// rule. A query that fails, a rule Prometheus cannot evaluate, a target
// not up, or a query with no series (but those of needsScenario) fails t.
func evaluateQueries(t *testing.T, ctx context.Context) {
	t.Helper()
	host, ok := cluster.Network.Host(cluster.Nodes[len(cluster.Nodes)-1].Name)
	if !ok {
		t.Fatal("no host for the last node")
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(serviceAccountToken(t, ctx, scraper)), 0o600); err != nil {
		t.Fatal(err)
	}
	rulesFile, err := filepath.Abs("../../../config/monitoring/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var jobs []any
	for _, svc := range []string{"ebb-controller-metrics", "ebb-lb-metrics", "ebb-node-agent-metrics"} {
		jobs = append(jobs, map[string]any{
			"job_name": svc, "scheme": "https",
			"authorization":  map[string]any{"credentials_file": tokenFile},
			"tls_config":     map[string]any{"insecure_skip_verify": true},
			"static_configs": []any{map[string]any{"targets": serviceTargets(ctx, svc)}},
		})
	}
	config, err := yaml.Marshal(map[string]any{
		"global":         map[string]any{"scrape_interval": "2s", "evaluation_interval": "2s"},
		"rule_files":     []string{rulesFile},
		"scrape_configs": jobs,
	})
	if err != nil {
		t.Fatal(err)
	}
	configFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configFile, config, 0o644); err != nil {
		t.Fatal(err)
	}
	prom := startPrometheus(t, ctx, host, configFile, dir)

	e2eutil.Eventually(t, ctx, time.Minute, "every target up, scraped 8 times", func(ctx context.Context) (bool, string) {
		var targets struct {
			ActiveTargets []struct {
				ScrapePool string `json:"scrapePool"`
				ScrapeURL  string `json:"scrapeUrl"`
				Health     string `json:"health"`
				LastError  string `json:"lastError"`
			} `json:"activeTargets"`
		}
		if err := prom.get(ctx, "/api/v1/targets", nil, &targets); err != nil {
			return false, err.Error()
		}
		var bad []string
		for _, tg := range targets.ActiveTargets {
			if tg.Health != "up" {
				bad = append(bad, fmt.Sprintf("%s %s: %s %s", tg.ScrapePool, tg.ScrapeURL, tg.Health, tg.LastError))
			}
		}
		if len(targets.ActiveTargets) == 0 || len(bad) > 0 {
			return false, fmt.Sprint(len(targets.ActiveTargets), " targets; ", bad)
		}
		// Rates need samples: 8 scrapes 2 s apart.
		n, err := prom.series(ctx, `count_over_time(up[30s])`)
		return err == nil && n > 0 && prom.minSamples(ctx, `count_over_time(up[30s])`) >= 8, fmt.Sprint(err)
	})

	checked, empty := 0, 0
	dashboards, err := filepath.Glob("../../../config/monitoring/dashboards/*.json")
	if err != nil || len(dashboards) == 0 {
		t.Fatalf("no dashboard: %v", err)
	}
	for _, f := range dashboards {
		exprs, err := metricsdoc.DashboardQueries(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, expr := range exprs {
			query := strings.NewReplacer("$__rate_interval", "30s", "$instance", ".*").Replace(expr)
			n, err := prom.series(ctx, query)
			checked++
			switch {
			case err != nil:
				t.Errorf("%s: %s: %v", filepath.Base(f), expr, err)
			case n == 0 && !allNeedScenario(expr):
				t.Errorf("%s: %s returned no series, and ebb's metrics it reads should exist here", filepath.Base(f), expr)
			case n == 0:
				empty++
			}
		}
	}
	checkRules(t, ctx, prom)
	t.Logf("Prometheus scraped ebb's pods through the ServiceMonitor's settings: %d dashboard queries evaluated, %d of them empty for want of a scenario (needsScenario)", checked, empty)
}

// checkRules fails t unless Prometheus evaluated every alert rule without
// error, and each names metrics that exist here (or need a scenario).
func checkRules(t *testing.T, ctx context.Context, prom *promAPI) {
	t.Helper()
	var rules struct {
		Groups []struct {
			Rules []struct {
				Name      string `json:"name"`
				Query     string `json:"query"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	e2eutil.Eventually(t, ctx, 30*time.Second, "every alert rule evaluated", func(ctx context.Context) (bool, string) {
		if err := prom.get(ctx, "/api/v1/rules", nil, &rules); err != nil {
			return false, err.Error()
		}
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				if r.Health == "unknown" {
					return false, r.Name + " not evaluated yet"
				}
			}
		}
		return len(rules.Groups) > 0, "no rule group loaded"
	})
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health != "ok" {
				t.Errorf("alert %s: %s %s", r.Name, r.Health, r.LastError)
			}
			for _, m := range ebbMetric.FindAllString(r.Query, -1) {
				if _, ok := needsScenario[m]; ok {
					continue
				}
				if c, err := prom.series(ctx, fmt.Sprintf("{__name__=%q}", m)); err != nil || c == 0 {
					t.Errorf("alert %s reads %s, which has no series here (%v)", r.Name, m, err)
				}
			}
		}
	}
	t.Logf("%d alert rules evaluated by Prometheus without error", n)
}

var ebbMetric = regexp.MustCompile(`\bebb_[a-z0-9_]+`)

// allNeedScenario reports whether every ebb metric expr reads needs a
// scenario this test does not run.
func allNeedScenario(expr string) bool {
	names := ebbMetric.FindAllString(expr, -1)
	return len(names) > 0 && !slices.ContainsFunc(names, func(n string) bool { _, ok := needsScenario[n]; return !ok })
}

// promAPI queries a Prometheus inside a network namespace.
type promAPI struct {
	client *http.Client
}

// startPrometheus runs Prometheus (hack/prometheus.sh builds it) in host's
// network namespace on 127.0.0.1:9090 until the test ends.
func startPrometheus(t *testing.T, ctx context.Context, host *network.Host, configFile, dir string) *promAPI {
	t.Helper()
	out, err := exec.CommandContext(ctx, "../../../hack/prometheus.sh").Output()
	if err != nil {
		t.Fatalf("building prometheus (hack/prometheus.sh): %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	logFile, err := os.Create(filepath.Join(cluster.Dir(), "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(lines[len(lines)-1], "--config.file="+configFile, "--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:9090")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Gone with the test process, even when a timeout skips the clean-up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := host.Start(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logFile.Close()
	})
	return &promAPI{client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return host.DialContext(ctx, network, "127.0.0.1:9090")
		},
	}}}
}

// get reads path of Prometheus' HTTP API into data.
func (p *promAPI) get(ctx context.Context, path string, params url.Values, data any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://prometheus"+path+"?"+params.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var envelope struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &envelope); err != nil {
		return fmt.Errorf("GET %s: %d %.200s", path, resp.StatusCode, body)
	}
	if envelope.Status != "success" {
		return fmt.Errorf("GET %s: %s", path, envelope.Error)
	}
	return json.Unmarshal(envelope.Data, data)
}

// series evaluates query now and returns how many series it returned.
func (p *promAPI) series(ctx context.Context, query string) (int, error) {
	var result struct {
		Result []json.RawMessage `json:"result"`
	}
	err := p.get(ctx, "/api/v1/query", url.Values{"query": {query}}, &result)
	return len(result.Result), err
}

// minSamples evaluates query and returns the smallest value among its
// series (0 when none).
func (p *promAPI) minSamples(ctx context.Context, query string) float64 {
	var result struct {
		Result []struct {
			Value [2]any `json:"value"`
		} `json:"result"`
	}
	if err := p.get(ctx, "/api/v1/query", url.Values{"query": {query}}, &result); err != nil || len(result.Result) == 0 {
		return 0
	}
	low := -1.0
	for _, r := range result.Result {
		var v float64
		if s, ok := r.Value[1].(string); ok {
			_, _ = fmt.Sscan(s, &v)
		}
		if low < 0 || v < low {
			low = v
		}
	}
	return low
}
