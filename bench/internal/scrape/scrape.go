// Package scrape reads a process's Prometheus metrics page: the benchmarks take
// figures from ebb's own counters and timestamps.
package scrape

import (
	"fmt"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Parse parses a Prometheus text page (what /metrics serves).
func Parse(page string) (map[string]*dto.MetricFamily, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(page))
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return families, nil
}

// Sum adds the values (counter or gauge) of the series of family name whose
// labels match every pair of want (a label listed with several values
// matches any of them).
func Sum(families map[string]*dto.MetricFamily, name string, want map[string][]string) float64 {
	f, ok := families[name]
	if !ok {
		return 0
	}
	total := 0.0
	for _, m := range f.GetMetric() {
		if matches(m, want) {
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total
}

// HistogramSum adds the sample sums of every series of the histogram
// family name.
func HistogramSum(families map[string]*dto.MetricFamily, name string) float64 {
	total := 0.0
	for _, m := range families[name].GetMetric() {
		total += m.GetHistogram().GetSampleSum()
	}
	return total
}

func matches(m *dto.Metric, want map[string][]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for name, values := range want {
		ok := false
		for _, v := range values {
			if have[name] == v {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}
