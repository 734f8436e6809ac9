// Package cli_test drives `ebb cluster up|exec|down` as a developer would,
// from the host: the built ebb binary ($EBB_BIN) in a shell.
package cli_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// ebb runs the ebb binary with the given state directory.
func ebb(ctx context.Context, t *testing.T, stateDir string, args ...string) (string, error) {
	t.Helper()
	bin := os.Getenv("EBB_BIN")
	if bin == "" {
		t.Fatal("EBB_BIN is not set: run the end-to-end tests with `make test` (it builds bin/ebb)")
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "EBB_STATE_DIR="+stateDir)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// processesMentioning lists host processes whose command line contains s.
func processesMentioning(s string) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), s) {
			out = append(out, e.Name()+" "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return out
}

func TestClusterUpExecDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	state := t.TempDir()
	name := fmt.Sprintf("cli-%d", os.Getpid())
	t.Cleanup(func() { _, _ = ebb(context.Background(), t, state, "cluster", "down", "--name", name) })

	start := time.Now()
	out, err := ebb(ctx, t, state, "cluster", "up", "--name", name, "--nodes", "2", "--with-ebb")
	if err != nil {
		t.Fatalf("ebb cluster up: %v\n%s", err, out)
	}
	t.Logf("ebb cluster up took %s", time.Since(start).Round(time.Millisecond))
	pidData, err := os.ReadFile(filepath.Join(state, name, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(pidData)))

	out, err = ebb(ctx, t, state, "cluster", "up", "--name", name)
	if err == nil || !strings.Contains(out, "already running") {
		t.Errorf("a second `ebb cluster up` should say the cluster is already running; got %v:\n%s", err, out)
	}

	out, err = ebb(ctx, t, state, "cluster", "exec", "--name", name, "--", "kubectl", "get", "nodes", "--no-headers")
	if err != nil {
		t.Fatalf("ebb cluster exec -- kubectl get nodes: %v\n%s", err, out)
	}
	if got := strings.Count(out, " Ready "); got != 2 {
		t.Errorf("kubectl get nodes shows %d Ready nodes, want 2:\n%s", got, out)
	}
	// The command runs on the cluster's control-plane host, on the node network.
	out, err = ebb(ctx, t, state, "cluster", "exec", "--name", name, "--", "sh", "-c", "ip -4 addr show ebb-nodes")
	if err != nil || !strings.Contains(out, "10.0.0.254/24") {
		t.Errorf("exec does not run in the cluster's network namespace: %v\n%s", err, out)
	}
	// With --with-ebb, a LoadBalancer Service applied with kubectl gets an
	// address that curl reaches from inside the cluster.
	manifest := filepath.Join(t.TempDir(), "hello.yaml")
	if err := os.WriteFile(manifest, []byte(helloManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := ebb(ctx, t, state, "cluster", "exec", "--name", name, "--", "kubectl", "apply", "-f", manifest); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	var answer string
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		answer, err = ebb(ctx, t, state, "cluster", "exec", "--name", name, "--", "sh", "-c",
			`curl -sS -m 2 "http://$(kubectl get service hello -o jsonpath='{.status.loadBalancer.ingress[0].ip}')/"`)
		if err == nil && strings.Contains(answer, `"pod":"hello-`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("curl through the Service's load-balancer address: %v\n%s", err, answer)
		}
	}

	// An exit code is passed on.
	if _, err := ebb(ctx, t, state, "cluster", "exec", "--name", name, "--", "sh", "-c", "exit 7"); err == nil {
		t.Error("exit 7 inside the cluster: ebb exited 0")
	} else if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 7 {
		t.Errorf("exit 7 inside the cluster: ebb returned %v", err)
	}

	out, err = ebb(ctx, t, state, "cluster", "down", "--name", name)
	if err != nil {
		t.Fatalf("ebb cluster down: %v\n%s", err, out)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		if stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); !strings.Contains(string(stat), ") Z ") {
			t.Errorf("the cluster supervisor (pid %d) still runs after down", pid)
		}
	}
	clusterDir := filepath.Join(state, name)
	if left := processesMentioning(clusterDir); len(left) != 0 {
		t.Errorf("processes of the cluster left after down: %v", left)
	}
	if _, err := os.Stat(clusterDir); !os.IsNotExist(err) {
		t.Errorf("state %s left after down (%v)", clusterDir, err)
	}
	out, err = ebb(ctx, t, state, "cluster", "exec", "--name", name, "--", "true")
	if err == nil || !strings.Contains(out, "not running") {
		t.Errorf("exec on a stopped cluster should say it is not running; got %v:\n%s", err, out)
	}
}

// `ebb cluster up --install dist/install.yaml` installs ebb as pods of its
// image; a Service applied with kubectl is served through ebb lb's pod.
func TestClusterUpInstallsTheRelease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	dist := e2eutil.DistDir()
	state := t.TempDir()
	name := fmt.Sprintf("cli-install-%d", os.Getpid())
	t.Cleanup(func() { _, _ = ebb(context.Background(), t, state, "cluster", "down", "--name", name) })
	start := time.Now()
	out, err := ebb(ctx, t, state, "cluster", "up", "--name", name, "--nodes", "2", "--install", filepath.Join(dist, "install.yaml"))
	if err != nil {
		t.Fatalf("ebb cluster up --install: %v\n%s", err, out)
	}
	t.Logf("ebb cluster up --install took %s", time.Since(start).Round(time.Millisecond))
	out, err = ebb(ctx, t, state, "cluster", "exec", "--name", name, "--", "kubectl", "get", "pods", "-n", "ebb-system", "--no-headers")
	running := 0
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[1] == "1/1" && f[2] == "Running" {
			running++
		}
	}
	if err != nil || strings.Count(out, "ebb-controller-") != 2 || !strings.Contains(out, "ebb-lb-") || running < 3 {
		t.Fatalf("ebb's pods after up --install: %v\n%s", err, out)
	}
	manifest := filepath.Join(t.TempDir(), "hello.yaml")
	if err := os.WriteFile(manifest, []byte(helloManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := ebb(ctx, t, state, "cluster", "exec", "--name", name, "--", "kubectl", "apply", "-f", manifest); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		answer, err := ebb(ctx, t, state, "cluster", "exec", "--name", name, "--", "sh", "-c",
			`curl -sS -m 2 "http://$(kubectl get service hello -o jsonpath='{.status.loadBalancer.ingress[0].ip}')/"`)
		if err == nil && strings.Contains(answer, `"pod":"hello-`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("curl through the Service's load-balancer address: %v\n%s", err, answer)
		}
	}
	if out, err := ebb(ctx, t, state, "cluster", "down", "--name", name); err != nil {
		t.Fatalf("ebb cluster down: %v\n%s", err, out)
	}
}

const helloManifest = `apiVersion: apps/v1
kind: Deployment
metadata: {name: hello}
spec:
  replicas: 2
  selector: {matchLabels: {app: hello}}
  template:
    metadata: {labels: {app: hello}}
    spec:
      containers:
      - {name: hello, image: hello, ports: [{containerPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: hello}
spec:
  type: LoadBalancer
  loadBalancerClass: ebb.dev/l4
  selector: {app: hello}
  ports: [{port: 80, targetPort: 8080}]
`
