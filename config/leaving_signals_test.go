package config

import (
	"os"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

const leavingSignalsFlag = "--leaving-signals-file=/etc/ebb/leaving-signals/signals"

// The shipped list is the documented default, and parses.
func TestLeavingSignalsConfigMapIsTheDefault(t *testing.T) {
	var cm corev1.ConfigMap
	readYAML(t, "leaving-signals/leaving-signals.yaml", &cm)
	got, err := lbmodel.ParseLeavingSignals(cm.Data["signals"])
	if err != nil {
		t.Fatal(err)
	}
	if want := lbmodel.DefaultLeavingSignals(); !slices.Equal(got, want) {
		t.Errorf("config/leaving-signals lists %v, want lbmodel's defaults %v", got, want)
	}
}

// The controller, ebb lb and the node-agent read the same list: each
// mounts the ConfigMap where its flag points.
func TestEveryComponentReadsTheLeavingSignals(t *testing.T) {
	var controller appsv1.Deployment
	readYAML(t, "manager/controller.yaml", &controller)
	var lb, agent appsv1.DaemonSet
	readYAML(t, "lb/lb.yaml", &lb)
	readYAML(t, "node-agent/node-agent.yaml", &agent)
	for name, spec := range map[string]corev1.PodSpec{"controller": controller.Spec.Template.Spec, "lb": lb.Spec.Template.Spec, "node-agent": agent.Spec.Template.Spec} {
		c := spec.Containers[0]
		if !slices.Contains(c.Args, leavingSignalsFlag) {
			t.Errorf("%s: args %v lack %s", name, c.Args, leavingSignalsFlag)
		}
		mounted := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.MountPath == "/etc/ebb/leaving-signals" && slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool {
				return v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == "ebb-leaving-signals"
			})
		})
		if !mounted {
			t.Errorf("%s does not mount ConfigMap ebb-leaving-signals at /etc/ebb/leaving-signals", name)
		}
	}
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
