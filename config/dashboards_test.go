package config

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var updateDashboards = flag.Bool("update-dashboards", false, "write components/dashboards/dashboards.yaml from monitoring/dashboards/*.json")

// dashboardConfigMaps are the ConfigMaps that carry the dashboards of
// monitoring/dashboards to Grafana's dashboard sidecar (it loads those
// labelled grafana_dashboard, as kube-prometheus-stack's does), as one
// YAML stream.
func dashboardConfigMaps(t *testing.T) []byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("monitoring", "dashboards", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboard in monitoring/dashboards: %v", err)
	}
	var out bytes.Buffer
	out.WriteString("# Generated from config/monitoring/dashboards/*.json by\n# go test ./config/ -run TestDashboardConfigMapsCarryTheDashboards -update-dashboards\n# (edit the dashboards there).\n")
	for i, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		cm := map[string]any{
			"apiVersion": "v1",
			"kind":       "ConfigMap",
			"metadata": map[string]any{
				"name":      strings.TrimSuffix(name, ".json"),
				"namespace": "ebb-system",
				"labels":    map[string]any{"app.kubernetes.io/name": "ebb", "app.kubernetes.io/component": "dashboards", "grafana_dashboard": "1"},
			},
			"data": map[string]any{name: string(data)},
		}
		y, err := yaml.Marshal(cm)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			out.WriteString("---\n")
		}
		out.Write(y)
	}
	return out.Bytes()
}

// The dashboards live once, as Grafana JSON in monitoring/dashboards; the
// component components/dashboards carries them as ConfigMaps. This test
// keeps the two equal: run it with -update-dashboards after editing one.
func TestDashboardConfigMapsCarryTheDashboards(t *testing.T) {
	want := dashboardConfigMaps(t)
	path := filepath.Join("components", "dashboards", "dashboards.yaml")
	if *updateDashboards {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s does not carry monitoring/dashboards: run go test ./config/ -run TestDashboardConfigMapsCarryTheDashboards -update-dashboards", path)
	}
}
