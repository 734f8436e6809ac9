package localcluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Faults for reliability benchmarks: what a crash, an outage of the
// control plane or a network partition does, made on purpose.

// KillPod sends SIGKILL to every process of the pod's containers, as a
// crash does: no preStop hook, no SIGTERM, no grace. The pod's sandbox
// (pause) is left alone, so kubelet sees the containers exit and restarts
// them by the pod's restart policy, as after a real crash. Real nodes
// only. It returns how many processes it killed.
func (c *Cluster) KillPod(pod *corev1.Pod) (int, error) {
	rn, err := c.realNode(pod.Spec.NodeName)
	if err != nil {
		return 0, fmt.Errorf("killing pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	pids, err := rn.podProcesses(pod)
	if err != nil {
		return 0, fmt.Errorf("killing pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	killed := 0
	for _, pid := range pids {
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "pause" {
			continue
		}
		err := syscall.Kill(pid, syscall.SIGKILL)
		if errors.Is(err, syscall.ESRCH) {
			continue // ended meanwhile: not this kill's
		}
		if err != nil {
			return killed, fmt.Errorf("killing process %d of pod %s/%s: %w", pid, pod.Namespace, pod.Name, err)
		}
		killed++
	}
	return killed, nil
}

// Control-plane components KillControlPlane can kill.
const (
	ComponentEtcd      = "etcd"
	ComponentAPIServer = "kube-apiserver"
)

// KillControlPlane kills etcd or kube-apiserver with SIGKILL and returns
// a function that starts it again with the same command line, environment
// and working directory (its data and certificates are where they were).
// The restarted process is the cluster's to stop; restart must not be
// called while the cluster stops.
func (c *Cluster) KillControlPlane(component string) (restart func() error, err error) {
	var marker string // an argument only this cluster's process has
	switch component {
	case ComponentEtcd:
		marker = filepath.Join(c.opts.Dir, "etcd")
	case ComponentAPIServer:
		marker = filepath.Join(c.opts.Dir, "pki")
	default:
		return nil, fmt.Errorf("no control-plane component %q (want %s or %s)", component, ComponentEtcd, ComponentAPIServer)
	}
	p, err := findProcess(component, marker)
	if err != nil {
		return nil, err
	}
	if err := syscall.Kill(p.pid, syscall.SIGKILL); err != nil {
		return nil, fmt.Errorf("killing %s (pid %d): %w", component, p.pid, err)
	}
	// Its parent (envtest, in this process) reaps it; wait for that, so
	// that the restart finds its ports free.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if err := syscall.Kill(p.pid, 0); errors.Is(err, syscall.ESRCH) {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s (pid %d) did not end within 10 s of SIGKILL", component, p.pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	restart = func() error {
		cmd := exec.Command(p.argv[0], p.argv[1:]...)
		cmd.Env, cmd.Dir = p.env, p.dir
		proc, err := startCommandOn(nil, component, cmd, filepath.Join(c.opts.Dir, "logs"))
		if err != nil {
			return fmt.Errorf("restarting %s: %w", component, err)
		}
		c.procs = append(c.procs, proc)
		return nil
	}
	return restart, nil
}

// processImage is what is needed to start a process again.
type processImage struct {
	pid  int
	argv []string
	env  []string
	dir  string
}

// findProcess finds the one process whose executable is named name and
// whose command line has an argument containing marker.
func findProcess(name, marker string) (*processImage, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	var found []*processImage
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil || filepath.Base(exe) != name {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cmdline, []byte(marker)) {
			continue
		}
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			return nil, fmt.Errorf("reading the environment of %s (pid %d): %w", name, pid, err)
		}
		dir, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		if err != nil {
			return nil, fmt.Errorf("reading the directory of %s (pid %d): %w", name, pid, err)
		}
		argv := splitNUL(cmdline)
		argv[0] = exe
		found = append(found, &processImage{pid: pid, argv: argv, env: splitNUL(environ), dir: dir})
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("%d processes %s with an argument naming %s, want 1", len(found), name, marker)
	}
	return found[0], nil
}

func splitNUL(b []byte) []string {
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

// CutFromControlPlane drops every packet between a node and the control
// plane's host, in the node's network namespace: its kubelet, its pods
// and what runs on its host lose the API server, the rest of its network
// (the router, the other nodes, the clients' traffic) works as before.
// heal takes the rule away.
func (c *Cluster) CutFromControlPlane(node string) (heal func() error, err error) {
	h, ok := c.Network.Host(node)
	if !ok {
		return nil, fmt.Errorf("the cluster has no node %q", node)
	}
	table := "ebb-cut-from-control-plane"
	nft := func(ruleset string) error {
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(ruleset)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := h.Start(cmd); err != nil {
			return fmt.Errorf("running nft on %s: %w", node, err)
		}
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("nft on %s: %w: %s", node, err, out.String())
		}
		return nil
	}
	if err := nft(cutRuleset(table, controlPlaneIP)); err != nil {
		return nil, fmt.Errorf("cutting %s from the control plane: %w", node, err)
	}
	return func() error { return nft("delete table inet " + table + "\n") }, nil
}

// cutRuleset drops what goes to or comes from addr, whether the node's own
// processes or its pods (forwarded) send it.
func cutRuleset(table, addr string) string {
	return fmt.Sprintf(`table inet %[1]s {
	chain in {
		type filter hook input priority -300;
		ip saddr %[2]s drop
	}
	chain out {
		type filter hook output priority -300;
		ip daddr %[2]s drop
	}
	chain through {
		type filter hook forward priority -300;
		ip saddr %[2]s drop
		ip daddr %[2]s drop
	}
}
`, table, addr)
}
