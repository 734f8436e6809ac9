package metricsdoc

import (
	"flag"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update-metrics-doc", false, "write docs/metrics.md from the source")

const root = "../.."

func TestFromFile(t *testing.T) {
	src := `package x
var d = prometheus.NewDesc("ebb_x_things_total", "Things " + "seen.", []string{"kind"}, nil)
var g = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ebb_x_level", Help: "The level."}, []string{"a", "b"})
var h = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ebb_x_seconds", Help: "How long.", Buckets: nil})
var c = prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ebb_x_read_total", Help: "Read."}, nil)
func f() {
	labels := []string{"request"}
	_ = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ebb_x_calls_total", Help: "Calls."}, append(labels, "code"))
}
var r = prometheus.NewRegistry()
`
	f, err := parser.ParseFile(token.NewFileSet(), "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := fromFile(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []Metric{
		{Name: "ebb_x_things_total", Type: "counter", Labels: []string{"kind"}, Help: "Things seen.", descVar: "d"},
		{Name: "ebb_x_level", Type: "gauge", Labels: []string{"a", "b"}, Help: "The level."},
		{Name: "ebb_x_seconds", Type: "histogram", Help: "How long."},
		{Name: "ebb_x_read_total", Type: "counter", Help: "Read."},
		{Name: "ebb_x_calls_total", Type: "counter", Labels: []string{"request", "code"}, Help: "Calls."},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}

	for _, bad := range []string{
		`package x
var g = prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "h"})`,
		`package x
var g = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ebb", Name: "x", Help: "h"})`,
		`package x
var g = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "x", Help: "h"}, labelsFromElsewhere())`,
		`package x
var g = prometheus.NewGauge(opts)`,
		`package x
var g = prometheus.NewGauge(prometheus.GaugeOpts{Help: "no name"})`,
		`package x
import prom "github.com/prometheus/client_golang/prometheus"
var g = prom.NewGauge(prom.GaugeOpts{Name: "x", Help: "h"})`,
		`package x
import "github.com/prometheus/client_golang/prometheus/promauto"
var g = promauto.NewGauge(prometheus.GaugeOpts{Name: "x", Help: "h"})`,
	} {
		f, err := parser.ParseFile(token.NewFileSet(), "x.go", bad, 0)
		if err != nil {
			t.Fatal(err)
		}
		if ms, err := fromFile(f, nil); err == nil {
			t.Errorf("%s: read as %+v, want an error", bad, ms)
		}
	}
}

// Extract takes a Desc's type from the collector's value type, and
// refuses a package that defines metrics in no component.
func TestExtract(t *testing.T) {
	root := t.TempDir()
	write := func(rel, src string) {
		t.Helper()
		path := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("internal/controller/x/desc.go", `package x
import "github.com/prometheus/client_golang/prometheus"
var seen = prometheus.NewDesc("ebb_x_seen", "Seen, a counter without _total.", nil, nil)
`)
	write("internal/controller/x/collect.go", `package x
import "github.com/prometheus/client_golang/prometheus"
func collect(ch chan<- prometheus.Metric) { ch <- prometheus.MustNewConstMetric(seen, prometheus.CounterValue, 1) }
`)
	write("internal/localcluster/y/y.go", `package y
import "github.com/prometheus/client_golang/prometheus"
var g = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tooling_gauge", Help: "Not ebb's."})
`)
	got, err := Extract(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []Metric{{Name: "ebb_x_seen", Type: "counter", Help: "Seen, a counter without _total.", Component: "ebb controller", Source: "internal/controller/x/desc.go"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	write("internal/newthing/z.go", `package z
import "github.com/prometheus/client_golang/prometheus"
var g = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ebb_z", Help: "Where?"})
`)
	if _, err := Extract(root); err == nil || !strings.Contains(err.Error(), "serves in no component") {
		t.Errorf("a package in no component: %v", err)
	}
}

// docs/metrics.md is what the source defines.
func TestMetricsReferenceIsUpToDate(t *testing.T) {
	metrics, err := Extract(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(metrics) < 50 {
		t.Fatalf("found %d metrics; ebb defines more than 50: is the extraction broken?", len(metrics))
	}
	page := Render(metrics)
	path := filepath.Join(root, "docs", "metrics.md")
	if *update {
		if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(old) != page {
		t.Errorf("docs/metrics.md is out of date: run go test ./internal/metricsdoc -update-metrics-doc")
	}
}

// Every metric an alert rule names is one a component defines: a
// renamed metric must not leave an alert that can never fire.
func TestAlertRulesNameDefinedMetrics(t *testing.T) {
	rules, err := os.ReadFile(filepath.Join(root, "config", "monitoring", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, line := range strings.Split(string(rules), "\n") {
		// Only the expressions: annotations name metrics in prose.
		if trimmed := strings.TrimSpace(line); strings.HasPrefix(trimmed, "summary:") || strings.HasPrefix(trimmed, "description:") {
			continue
		}
		exprs = append(exprs, line)
	}
	checkNamedMetrics(t, "an alert rule", exprs)
}

// The dashboards' queries name only metrics and labels ebb defines (the
// e2e test test/e2e/helm also evaluates them against a real scrape).
func TestDashboardsNameDefinedMetrics(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(root, "config", "monitoring", "dashboards", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboard in config/monitoring/dashboards: %v", err)
	}
	for _, f := range files {
		exprs, err := DashboardQueries(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(exprs) == 0 {
			t.Errorf("%s has no query", f)
		}
		checkNamedMetrics(t, "a panel of "+filepath.Base(f), exprs)
	}
}

// checkNamedMetrics fails t for each ebb metric the expressions name that
// no component defines, and each label they match it on that it does not
// have: a renamed metric or label leaves a rule or panel that selects
// nothing.
func checkNamedMetrics(t *testing.T, what string, exprs []string) {
	t.Helper()
	metrics, err := Extract(root)
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	labels := map[string][]string{}
	for _, m := range metrics {
		defined[m.Name] = true
		labels[m.Name] = m.Labels
		if m.Type == "histogram" || m.Type == "summary" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				defined[m.Name+s] = true
				labels[m.Name+s] = slices.Concat(m.Labels, []string{"le", "quantile"})
			}
		}
	}
	names := regexp.MustCompile(`\bebb_[a-z0-9_]+`).FindAllString(strings.Join(exprs, "\n"), -1)
	if len(names) == 0 {
		t.Fatalf("%s: no ebb metric named: is the file's form changed?", what)
	}
	for _, n := range names {
		if !defined[n] {
			t.Errorf("%s names %s, which no component defines", what, n)
		}
	}
	// instance and job are the scrape's.
	selectors := regexp.MustCompile(`\b(ebb_[a-z0-9_]+)\{([^}]*)\}`).FindAllStringSubmatch(strings.Join(exprs, "\n"), -1)
	matchers := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	checked := 0
	for _, sel := range selectors {
		for _, m := range matchers.FindAllStringSubmatch(sel[2], -1) {
			checked++
			if l := m[1]; l != "instance" && l != "job" && !slices.Contains(labels[sel[1]], l) {
				t.Errorf("%s selects %s on label %s, which it does not have (labels %v)", what, sel[1], l, labels[sel[1]])
			}
		}
	}
	if checked == 0 {
		t.Errorf("%s: no label matcher found: is the file's form changed?", what)
	}
}
