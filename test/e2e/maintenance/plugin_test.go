package maintenance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// kubectlMaintenance runs `kubectl maintenance ARGS` the way a user does:
// kubectl finds the plugin on PATH.
func kubectlMaintenance(t *testing.T, ctx context.Context, args ...string) (string, error) {
	t.Helper()
	bin, err := ebbBin()
	if err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(filepath.Dir(bin))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(cluster.BinDir, "kubectl"), append([]string{"maintenance", "--kubeconfig", cluster.Kubeconfig}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+abs+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The plugin drains a node, lists it, explains what holds it back (a
// PodDisruptionBudget, and the drain plan keeping a higher-priority pod for
// later), watches it to the end and completes it.
func TestKubectlMaintenancePlugin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	node := cluster.Nodes[2].Name
	priorityClass(t, ctx, "e2e-high", 1000)
	pinnedApp(t, ctx, ns, "web", node, "", 2)
	pinnedApp(t, ctx, ns, "high", node, "e2e-high", 1)
	highPod := appPods(t, ctx, ns, "high")[0].Name
	release := pdb(t, ctx, ns, "web", 2)
	defer release()
	t.Cleanup(func() { deleteAndWait(t, context.Background(), "plugin") })
	plan := filepath.Join(t.TempDir(), "plan.yaml")
	if err := os.WriteFile(plan, []byte("- {podType: Default, podPriority: 100}\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	out, err := kubectlMaintenance(t, ctx, "drain", node, "--reason", "plugin test", "--name", "plugin", "--plan", plan)
	if err != nil || !strings.Contains(out, "nodemaintenance/plugin created (stage Drain)") {
		t.Fatalf("drain: %v\n%s", err, out)
	}
	eventually(t, ctx, 20*time.Second, "the maintenance listed with its node", func(ctx context.Context) (bool, string) {
		out, err := kubectlMaintenance(t, ctx, "list")
		return err == nil && strings.Contains(out, "NAME") && strings.Contains(out, "plugin") && strings.Contains(out, node) && strings.Contains(out, "plugin test"), out
	})
	eventually(t, ctx, 30*time.Second, "status explaining the budget", func(ctx context.Context) (bool, string) {
		out, _ := kubectlMaintenance(t, ctx, "status", "plugin")
		return strings.Contains(out, "plugin: stage Drain, drained False") &&
			strings.Contains(out, "0/3 evacuated") &&
			strings.Contains(out, "The disruption budget web needs 2 healthy pods and has 2 currently") &&
			strings.Contains(out, "evictions refused") && strings.Contains(out, "next attempt in") &&
			strings.Contains(out, ns+"/"+highPod+": held back by the drain plan (Default pod, priority 1000)"), out
	})

	release()
	out, err = kubectlMaintenance(t, ctx, "status", "plugin", "--watch")
	if err != nil || !strings.Contains(out, "drained True") || !strings.Contains(out, "3/3 evacuated") || !strings.Contains(out, "[####################]") {
		t.Errorf("status --watch: %v\n%s", err, out)
	}
	out, err = kubectlMaintenance(t, ctx, "status", "plugin", "-o", "json")
	var nm v1alpha1.NodeMaintenance
	if err != nil || json.Unmarshal([]byte(out), &nm) != nil || nm.Kind != "NodeMaintenance" || nm.Name != "plugin" {
		t.Errorf("status -o json: %v\n%s", err, out)
	}
	out, err = kubectlMaintenance(t, ctx, "complete", "plugin")
	if err != nil || !strings.Contains(out, "nodemaintenance/plugin completed") {
		t.Errorf("complete: %v\n%s", err, out)
	}
	if got := getNM(t, ctx, "plugin"); got.Spec.Stage != v1alpha1.Complete {
		t.Errorf("stage %s after complete", got.Spec.Stage)
	}

	out, err = kubectlMaintenance(t, ctx, "drain")
	if err == nil || !strings.Contains(out, "give node names or -l SELECTOR") {
		t.Errorf("drain without nodes: %v\n%s", err, fmt.Sprint(out))
	}
}

// A maintenance planned ahead (Idle) touches nothing until it is started;
// started, it cordons and drains; a start after Complete is refused with the
// allowed moves.
func TestKubectlMaintenancePlanThenStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := cluster.Nodes[2].Name
	t.Cleanup(func() { deleteAndWait(t, context.Background(), "planned") })

	out, err := kubectlMaintenance(t, ctx, "drain", node, "--plan-only", "--name", "planned", "--reason", "next week")
	if err != nil || !strings.Contains(out, "nodemaintenance/planned created (stage Idle)") {
		t.Fatalf("drain --plan-only: %v\n%s", err, out)
	}
	time.Sleep(2 * time.Second) // time for a controller to (wrongly) act
	if n := getNode(t, ctx, node); n.Spec.Unschedulable {
		t.Fatalf("a planned maintenance cordoned %s", node)
	}

	out, err = kubectlMaintenance(t, ctx, "start", "planned", "--watch")
	if err != nil || !strings.Contains(out, "nodemaintenance/planned started (stage Drain)") || !strings.Contains(out, "drained True") {
		t.Fatalf("start --watch: %v\n%s", err, out)
	}
	if n := getNode(t, ctx, node); !n.Spec.Unschedulable {
		t.Errorf("%s is schedulable after its maintenance started", node)
	}
	if out, err := kubectlMaintenance(t, ctx, "complete", "planned"); err != nil {
		t.Fatalf("complete: %v\n%s", err, out)
	}
	out, err = kubectlMaintenance(t, ctx, "start", "planned")
	if err == nil || !strings.Contains(out, "spec.stage can only move forward") {
		t.Errorf("start after Complete: %v\n%s", err, out)
	}
}
