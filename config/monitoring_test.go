package config

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var updateRules = flag.Bool("update-prometheusrule", false, "write components/monitoring/prometheusrule.yaml from monitoring/rules.yaml")

// The alert rules live once, in monitoring/rules.yaml (a plain rules
// file); the PrometheusRule of components/monitoring carries the same
// groups for the Prometheus operator. This test keeps the two equal: run
// it with -update-prometheusrule after editing the rules.
func TestPrometheusRuleCarriesTheRulesFile(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("monitoring", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules map[string]any
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("monitoring/rules.yaml: %v", err)
	}
	want := map[string]any{
		"apiVersion": "monitoring.coreos.com/v1",
		"kind":       "PrometheusRule",
		"metadata": map[string]any{
			"name":      "ebb",
			"namespace": "ebb-system",
			"labels":    map[string]any{"app.kubernetes.io/name": "ebb", "app.kubernetes.io/component": "alerts"},
		},
		"spec": rules,
	}
	path := filepath.Join("components", "monitoring", "prometheusrule.yaml")
	if *updateRules {
		out, err := yaml.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		header := "# Generated from config/monitoring/rules.yaml by\n# go test ./config/ -run TestPrometheusRuleCarriesTheRulesFile -update-prometheusrule\n# (edit the rules there).\n"
		if err := os.WriteFile(path, append([]byte(header), out...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err = os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := yaml.Unmarshal(raw, &got); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	// Both sides through the same JSON round trip, so that only content
	// counts.
	wantJSON, _ := yaml.Marshal(want)
	var wantBack map[string]any
	if err := yaml.Unmarshal(wantJSON, &wantBack); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, wantBack) {
		t.Errorf("%s does not carry monitoring/rules.yaml: run go test ./config/ -run TestPrometheusRuleCarriesTheRulesFile -update-prometheusrule", path)
	}
}

// promtool checks the rules and runs their unit tests (each alert firing
// on the series that should fire it, quiet on the others). promtool is
// built from source by hack/promtool.sh (make tools builds it first).
func TestAlertRulesPassPromtool(t *testing.T) {
	out, err := exec.Command("../hack/promtool.sh").Output()
	if err != nil {
		t.Fatalf("building promtool (hack/promtool.sh): %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	promtool := lines[len(lines)-1]
	for _, args := range [][]string{
		{"check", "rules", "monitoring/rules.yaml"},
		{"test", "rules", "monitoring/rules_test.yaml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
