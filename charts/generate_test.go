package charts_test

import (
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

var updateChart = flag.Bool("update-chart", false, "write charts/ebb/files/ from config/")

// filesHeader opens every generated file of the chart.
const filesHeader = "# Generated from config/ by go test ./charts -update-chart: edit config/, not this file.\n"

// templated are the objects of config/default that the chart's templates
// write themselves, because values change them; every other object is
// copied into files/config/ and rendered as it is (namespace apart).
var templated = map[string]bool{
	"Namespace/ebb-system":               true, // helm install --create-namespace
	"Deployment/ebb-controller":          true,
	"PodDisruptionBudget/ebb-controller": true,
	"DaemonSet/ebb-lb":                   true,
	"DaemonSet/ebb-node-agent":           true,
	"ConfigMap/ebb-leaving-signals":      true,
}

// copiedKinds are the kinds copied as they are, by the directory of
// files/config/ that holds them (the chart's templates read each
// directory). An object of another kind in config/ fails the generation,
// so that someone decides where it goes.
var copiedKinds = map[string]string{
	"CustomResourceDefinition":         "crds",
	"MutatingWebhookConfiguration":     "webhooks",
	"ValidatingWebhookConfiguration":   "webhooks",
	"ServiceAccount":                   "base",
	"ClusterRole":                      "base",
	"ClusterRoleBinding":               "base",
	"Role":                             "base",
	"RoleBinding":                      "base",
	"Service":                          "base",
	"ValidatingAdmissionPolicy":        "base",
	"ValidatingAdmissionPolicyBinding": "base",
}

// generatedFiles renders config/ and returns the chart's generated files,
// by path under charts/ebb: files/config/DIR/KIND_NAME.yaml for every
// object copied, files/config/eviction-guard/ for the objects that the
// eviction-guard component adds, files/alert-rules.yaml, the rules of
// config/monitoring/rules.yaml, and files/dashboards/, the Grafana
// dashboards of config/monitoring/dashboards.
func generatedFiles(t *testing.T) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	add := func(dir string, o *unstructured.Unstructured) {
		data, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("files", "config", dir, strings.ToLower(o.GetKind()+"_"+o.GetName())+".yaml")
		files[path] = append([]byte(filesHeader), data...)
	}
	base := renderKustomize(t, "")
	for _, o := range base {
		if templated[o.GetKind()+"/"+o.GetName()] {
			continue
		}
		dir, ok := copiedKinds[o.GetKind()]
		if !ok {
			t.Fatalf("config/default has %s, which the chart neither templates nor copies: add it to templated (and a template) or to copiedKinds", key(o))
		}
		add(dir, o)
	}
	for _, o := range renderKustomize(t, "", "eviction-guard") {
		if find(base, o.GetKind(), o.GetName()) == nil {
			add("eviction-guard", o)
		}
	}
	dashboards, err := filepath.Glob(filepath.Join(configDir, "monitoring", "dashboards", "*.json"))
	if err != nil || len(dashboards) == 0 {
		t.Fatalf("no dashboard in config/monitoring/dashboards: %v", err)
	}
	for _, d := range dashboards {
		data, err := os.ReadFile(d)
		if err != nil {
			t.Fatal(err)
		}
		// JSON has no comments: the file is as it is.
		files[filepath.Join("files", "dashboards", filepath.Base(d))] = data
	}
	rules, err := os.ReadFile(filepath.Join(configDir, "monitoring", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files[filepath.Join("files", "alert-rules.yaml")] = append([]byte(filesHeader), rules...)
	return files
}

// The chart's files/ are config/'s objects as kustomize renders them:
// this test fails when they are not (run it with -update-chart after
// changing config/ or the generated CRDs, RBAC and webhooks).
func TestChartFilesAreGeneratedFromConfig(t *testing.T) {
	want := generatedFiles(t)
	filesDir := filepath.Join(chartDir, "files")
	if *updateChart {
		if err := os.RemoveAll(filesDir); err != nil {
			t.Fatal(err)
		}
		for path, data := range want {
			full := filepath.Join(chartDir, path)
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(full, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := map[string][]byte{}
	err := filepath.WalkDir(filesDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(chartDir, path)
		got[rel] = data
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var stale []string
	for path, data := range want {
		if string(got[path]) != string(data) {
			stale = append(stale, path)
		}
	}
	for path := range got {
		if _, ok := want[path]; !ok {
			stale = append(stale, path+" (no longer in config/)")
		}
	}
	if len(stale) > 0 {
		slices.Sort(stale)
		t.Errorf("charts/ebb's generated files are out of date: run go test ./charts -run TestChartFilesAreGeneratedFromConfig -update-chart\n%s", strings.Join(stale, "\n"))
	}
}
