package charts_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// chartDir and configDir are relative to this package's directory, where
// go test runs.
const (
	chartDir  = "ebb"
	configDir = "../config"
)

// renderKustomize renders config/default with the components named (of
// config/components), or overlay (a directory of config/) instead when
// set, as kubectl kustomize does.
func renderKustomize(t *testing.T, overlay string, components ...string) []*unstructured.Unstructured {
	t.Helper()
	root, err := filepath.Abs(configDir)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, overlay)
	if overlay == "" {
		dir = t.TempDir()
		// kustomize takes no absolute path to another kustomization.
		rel := func(path string) string {
			r, err := filepath.Rel(dir, path)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		k := "resources:\n- " + rel(filepath.Join(root, "default")) + "\n"
		if len(components) > 0 {
			k += "components:\n"
			for _, c := range components {
				k += "- " + rel(filepath.Join(root, "components", c)) + "\n"
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := resources.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeObjects(out)
	if err != nil {
		t.Fatalf("reading kustomize's render of %s: %v", dir, err)
	}
	return objs
}

// helmBinary builds helm once per test binary (hack/helm.sh; make tools
// builds it first) and returns its path.
var helmBinary = sync.OnceValues(func() (string, error) {
	out, err := exec.Command("../hack/helm.sh").Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return "", fmt.Errorf("building helm (hack/helm.sh): %w\n%s", err, exit.Stderr)
		}
		return "", fmt.Errorf("building helm (hack/helm.sh): %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
})

// helm runs the helm binary with args and returns its standard output, or
// an error carrying its standard error.
func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	bin, err := helmBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	// No user's helm configuration or cache counts.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out, nil
}

// renderHelm renders the chart in namespace with the values given as
// helm's --set arguments.
func renderHelm(t *testing.T, namespace string, set ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := helm(t, templateArgs(namespace, set...)...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeObjects(out)
	if err != nil {
		t.Fatalf("reading helm template's output: %v\n%s", err, out)
	}
	return objs
}

// templateArgs are helm template's arguments for the release "ebb" of the
// chart in namespace, with --set for each of set.
func templateArgs(namespace string, set ...string) []string {
	args := []string{"template", "ebb", chartDir, "--namespace", namespace}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return args
}

// decodeObjects reads the objects of a stream of YAML documents, skipping
// empty ones.
func decodeObjects(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if m != nil {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}

// key names an object as kubectl does, with its namespace.
func key(o *unstructured.Unstructured) string {
	return fmt.Sprintf("%s/%s %s/%s", o.GroupVersionKind().Group, o.GetKind(), o.GetNamespace(), o.GetName())
}

// find returns the object of kind and name among objs, or nil.
func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// formatValue formats a value of an object as %v does (maps with their
// keys sorted).
func formatValue(v any) string { return fmt.Sprint(v) }

// dump is o as YAML, for messages and searches ("" for no object).
func dump(o *unstructured.Unstructured) string {
	if o == nil {
		return ""
	}
	data, err := yaml.Marshal(o.Object)
	if err != nil {
		return err.Error()
	}
	return string(data)
}
