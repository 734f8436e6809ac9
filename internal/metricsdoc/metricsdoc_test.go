package metricsdoc

import (
	"flag"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
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
		{Name: "ebb_x_things_total", Type: "counter", Labels: []string{"kind"}, Help: "Things seen."},
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
	metrics, err := Extract(root)
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	for _, m := range metrics {
		defined[m.Name] = true
		if m.Type == "histogram" || m.Type == "summary" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				defined[m.Name+s] = true
			}
		}
	}
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
	names := regexp.MustCompile(`\bebb_[a-z0-9_]+`).FindAllString(strings.Join(exprs, "\n"), -1)
	if len(names) == 0 {
		t.Fatal("no ebb metric in the rules: is the file's form changed?")
	}
	for _, n := range names {
		if !defined[n] {
			t.Errorf("an alert rule names %s, which no component defines", n)
		}
	}
}
