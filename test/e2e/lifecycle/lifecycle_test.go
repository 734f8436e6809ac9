// Package lifecycle_test checks that a local cluster starts with everything
// a user expects and that stopping it leaves no process behind: on
// simulated nodes, and on real ones, whose kubelets, containerd, shims and
// pods must go with their cgroups.
package lifecycle_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/realnode"
)

func TestMain(m *testing.M) {
	if !localcluster.InNamespace() {
		// The host's user namespace: real nodes need it (cgroups, mounts).
		code, err := localcluster.ReexecInHostUserNamespace()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		os.Exit(code)
	}
	if err := localcluster.SetupNamespace(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// otherProcesses lists the processes of this PID namespace other than the
// test itself (it is the namespace's init, so any other is the cluster's).
func otherProcesses(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue // exited meanwhile
		}
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if s := string(stat); strings.Contains(s[strings.LastIndexByte(s, ')')+1:], " Z ") {
			continue // a zombie is no longer running
		}
		out = append(out, fmt.Sprintf("%d %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	return out
}

func TestStartServesKubectlAndStopLeavesNoProcesses(t *testing.T) {
	if left := otherProcesses(t); len(left) != 0 {
		t.Fatalf("processes before the cluster started: %v", left)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := localcluster.Start(ctx, localcluster.Options{Name: "lifecycle", Nodes: 2, Progress: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster ready in %s", time.Since(start).Round(time.Millisecond))
	running := otherProcesses(t)
	for _, want := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"} {
		found := false
		for _, p := range running {
			found = found || strings.Contains(p, "/"+want+" ")
		}
		if !found {
			t.Errorf("no %s process among %v", want, running)
		}
	}

	// kubectl, as a user runs it, sees the Ready nodes and the pinned version.
	kubectl := func(args ...string) string {
		cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, "kubectl"), args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	nodes := kubectl("get", "nodes", "--no-headers")
	for _, n := range c.Nodes {
		if !strings.Contains(nodes, n.Name) {
			t.Errorf("kubectl get nodes does not list %s:\n%s", n.Name, nodes)
		}
	}
	if got := strings.Count(nodes, " Ready "); got != len(c.Nodes) {
		t.Errorf("kubectl get nodes shows %d Ready nodes, want %d:\n%s", got, len(c.Nodes), nodes)
	}
	if version := kubectl("version"); !strings.Contains(version, "Server Version: v1.36.3") {
		t.Errorf("kubectl version does not report server v1.36.3:\n%s", version)
	}

	dir := c.Dir()
	if err := c.Stop(); err != nil {
		t.Fatalf("stopping: %v", err)
	}
	if left := otherProcesses(t); len(left) != 0 {
		t.Errorf("processes left after Stop: %v", left)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("cluster directory %s left after Stop (%v)", dir, err)
	}
}

// Real nodes: kubelet and containerd run, a pod runs in containerd, and
// Stop leaves no process (the shims and the pod's containers included) and
// none of the nodes' cgroups.
func TestRealNodesStopLeavesNoProcessesNorCgroups(t *testing.T) {
	if left := otherProcesses(t); len(left) != 0 {
		t.Fatalf("processes before the cluster started: %v", left)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := localcluster.Start(ctx, localcluster.Options{Name: "lifecycle-real", Nodes: 2, RealKubelets: true, Progress: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster with real nodes ready in %s", time.Since(start).Round(time.Millisecond))
	ns := "lifecycle"
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, c.AppDeployment(ns, "app", 2), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDeploymentAvailable(ctx, ns, "app", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	running := otherProcesses(t)
	for _, want := range []string{"/kubelet ", "/containerd ", "containerd-shim-runc-v2", "/agnhost netexec"} {
		n := 0
		for _, p := range running {
			if strings.Contains(p, want) {
				n++
			}
		}
		if n < 2 {
			t.Errorf("%d processes %q, want one per node or pod at least (2)", n, want)
		}
	}
	cgroups := nodeCgroups(t, c.CgroupParent())
	if len(cgroups) == 0 {
		t.Fatal("no cgroup " + c.CgroupParent() + " of the cluster's nodes")
	}

	if err := c.Stop(); err != nil {
		t.Fatalf("stopping: %v", err)
	}
	if left := otherProcesses(t); len(left) != 0 {
		t.Errorf("processes left after Stop: %v", left)
	}
	for _, dir := range cgroups {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("cgroup %s left after Stop (%v)", dir, err)
		}
	}
}

// nodeCgroups lists the cgroup path in every hierarchy where it exists.
func nodeCgroups(t *testing.T, path string) []string {
	t.Helper()
	hierarchies, err := realnode.FindCgroups()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range hierarchies.Mounts {
		if dir := filepath.Join(m, path); isDir(dir) {
			out = append(out, dir)
		}
	}
	return out
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}
