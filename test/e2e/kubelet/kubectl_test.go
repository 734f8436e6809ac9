package kubelet_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// kubectl runs the cluster's kubectl as the administrator and returns its
// standard output.
func kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(cluster.BinDir, "kubectl"), append([]string{"--kubeconfig", cluster.Kubeconfig}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// TestExecLogsAndPortForwardReachARealPod drives what a real kubelet
// serves and the stand-in never did: `kubectl exec` (a shell in the app's
// container), `kubectl logs` (what the container printed) and `kubectl
// port-forward` (a request to the pod's port through the apiserver and
// kubelet), as a user does.
func TestExecLogsAndPortForwardReachARealPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	dep := localcluster.AgnhostDeployment(ns, "app", 1)
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitDeploymentAvailable(ctx, ns, "app", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	pod := onlyPod(t, ctx, ns, "app=app")

	out, err := kubectl(ctx, "-n", ns, "exec", pod.Name, "--", "/bin/sh", "-c", "echo $((6*7)) $(hostname)")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("42 %s", pod.Name); strings.TrimSpace(out) != want {
		t.Errorf("kubectl exec printed %q, want %q", out, want)
	}
	// exec -i: standard input reaches the container.
	cmd := exec.CommandContext(ctx, filepath.Join(cluster.BinDir, "kubectl"), "--kubeconfig", cluster.Kubeconfig, "-n", ns, "exec", "-i", pod.Name, "--", "/bin/sh", "-c", "tr a-z A-Z")
	cmd.Stdin = strings.NewReader("through stdin\n")
	upper, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl exec -i: %v", err)
	}
	if strings.TrimSpace(string(upper)) != "THROUGH STDIN" {
		t.Errorf("kubectl exec -i printed %q, want %q", upper, "THROUGH STDIN")
	}

	logs, err := kubectl(ctx, "-n", ns, "logs", pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs, "Started HTTP server on port 8080") {
		t.Errorf("kubectl logs has no line of netexec's start:\n%s", logs)
	}

	hostname := getThroughPortForward(t, ctx, ns, "pod/"+pod.Name, 8080, "/hostname")
	if hostname != pod.Name {
		t.Errorf("GET /hostname through kubectl port-forward = %q, want %q", hostname, pod.Name)
	}
}

// TestExecLogsAndPortForwardReachAnEbbPod does the same with ebb's own
// controller, a container of ebb's image (no shell in it): its binary runs
// through exec, its log is read, and its metrics, served on the pod's
// loopback only, are read through port-forward as docs/operations say.
func TestExecLogsAndPortForwardReachAnEbbPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pods, err := cluster.Client.CoreV1().Pods("ebb-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=ebb-controller"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) == 0 {
		t.Fatal("no ebb controller pod")
	}
	pod := pods.Items[0]
	out, err := kubectl(ctx, "-n", "ebb-system", "exec", pod.Name, "--", "/usr/local/bin/ebb", "--version")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "ebb version") {
		t.Errorf("ebb --version in the controller's container printed %q", out)
	}
	logs, err := kubectl(ctx, "-n", "ebb-system", "logs", pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs, "Starting") {
		t.Errorf("the controller's log has no line of its start:\n%s", logs)
	}
	metrics := getThroughPortForward(t, ctx, "ebb-system", "pod/"+pod.Name, 8080, "/metrics")
	if !strings.Contains(metrics, "controller_runtime_webhook_requests_total") {
		t.Errorf("the controller's metrics through port-forward lack controller_runtime_webhook_requests_total:\n%.2000s", metrics)
	}
}

// getThroughPortForward runs `kubectl port-forward` to target's port and
// returns the body of a GET of path through it.
func getThroughPortForward(t *testing.T, ctx context.Context, ns, target string, port int, path string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(cluster.BinDir, "kubectl"), "--kubeconfig", cluster.Kubeconfig, "-n", ns,
		"port-forward", "--address", "127.0.0.1", target, fmt.Sprintf(":%d", port))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
	}()
	// "Forwarding from 127.0.0.1:41235 -> 8080"
	forwarding := regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) ->`)
	lines := bufio.NewScanner(stdout)
	local := ""
	for local == "" && lines.Scan() {
		if m := forwarding.FindStringSubmatch(lines.Text()); m != nil {
			local = m[1]
		}
	}
	if local == "" {
		t.Fatalf("kubectl port-forward %s printed no local port: %s", target, stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://127.0.0.1:" + local + path)
	if err != nil {
		t.Fatalf("GET %s through kubectl port-forward %s: %v (%s)", path, target, err, stderr.String())
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s through kubectl port-forward %s: %s: %s", path, target, resp.Status, body)
	}
	return string(body)
}

// onlyPod is the one pod of ns that selector selects.
func onlyPod(t *testing.T, ctx context.Context, ns, selector string) corev1.Pod {
	t.Helper()
	pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("%d pods match %s in %s, want 1", len(pods.Items), selector, ns)
	}
	return pods.Items[0]
}
