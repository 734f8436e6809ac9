package localcluster

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/ebbdev/ebb/internal/localcluster/network"
	"github.com/ebbdev/ebb/internal/localcluster/nodeimage"
	"github.com/ebbdev/ebb/internal/localcluster/realnode"
)

// realNode is a running real node: the processes that make it, in start
// order (the mount namespace's holder, containerd, kubelet).
type realNode struct {
	spec    realnode.Node
	files   realnode.Files
	node    Node
	binDir  string
	logDir  string
	cgroups realnode.Cgroups
	holder  *process
	procs   []*process
}

// clusterCgroup is the cgroup under which every real node of the cluster
// has its own: the cluster's name and a digest of its directory, so that
// two clusters of one name (two runs of a test package at once) never
// share one.
func (c *Cluster) clusterCgroup() string {
	sum := sha256.Sum256([]byte(c.opts.Dir))
	return path.Join(realnode.CgroupParent, fmt.Sprintf("%s-%x", c.opts.Name, sum[:4]))
}

// CgroupParent is the cgroup (in every hierarchy) under which the real
// nodes of this cluster have theirs; Stop removes it.
func (c *Cluster) CgroupParent() string { return c.clusterCgroup() }

// startRealNodes starts containerd and kubelet on every node, each in the
// node's network namespace and a mount namespace and cgroup of its own,
// with the cluster's images imported; kubelet registers the node.
func (c *Cluster) startRealNodes(ctx context.Context) error {
	c.progressf("starting containerd and kubelet on %d nodes", len(c.Nodes))
	cgroups, err := realnode.FindCgroups()
	if err != nil {
		return err
	}
	// A cluster that crashed leaves its nodes' cgroups, empty.
	if err := cgroups.RemoveStale(); err != nil {
		c.progressf("removing the cgroups earlier clusters left: %v", err)
	}
	archives, err := c.nodeImages()
	if err != nil {
		return err
	}
	clientCA, err := c.kubeletClientCABundle()
	if err != nil {
		return err
	}
	for _, n := range c.Nodes {
		rn, err := c.startRealNode(ctx, n, cgroups, clientCA, archives)
		if rn != nil {
			c.realNodes = append(c.realNodes, rn)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// nodeImages builds the pod sandbox and app images and packs every image
// the nodes get (those and Options.Images) for import.
func (c *Cluster) nodeImages() ([]nodeimage.Archive, error) {
	start := time.Now()
	dir := filepath.Join(c.opts.Dir, "node-images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	pause, err := nodeimage.Pause(c.opts.BinDir, dir)
	if err != nil {
		return nil, fmt.Errorf("building the pause image: %w", err)
	}
	agnhost, err := nodeimage.Agnhost(c.opts.BinDir, nodeimage.Busybox, dir)
	if err != nil {
		return nil, fmt.Errorf("building the agnhost image: %w", err)
	}
	archives := []nodeimage.Archive{pause, agnhost}
	if c.opts.CoreDNS != "" {
		dns, err := nodeimage.CoreDNS(c.opts.CoreDNS, dir)
		if err != nil {
			return nil, fmt.Errorf("building the CoreDNS image from %s: %w", c.opts.CoreDNS, err)
		}
		archives = append(archives, dns)
	}
	for _, l := range c.opts.Images {
		a, err := nodeimage.FromLayout(l, dir)
		if err != nil {
			return nil, err
		}
		archives = append(archives, a)
	}
	c.progressf("built the nodes' images in %s", time.Since(start).Round(10*time.Millisecond))
	return archives, nil
}

// kubeletClientCABundle writes the CAs kubelets trust for clients:
// envtest's client CA (an administrator's certificate, for kubectl through
// kubelet's port in a test) and the apiserver's kubelet client CA.
func (c *Cluster) kubeletClientCABundle() (string, error) {
	pki := c.env.ControlPlane.APIServer.CertDir
	var bundle []byte
	for _, f := range []string{filepath.Join(pki, "client-cert-auth-ca.crt"), c.kubeletCerts.CAFile} {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("reading a CA for the kubelets: %w", err)
		}
		bundle = append(bundle, data...)
	}
	out := filepath.Join(pki, "kubelet-client-ca-bundle.crt")
	if err := os.WriteFile(out, bundle, 0o644); err != nil {
		return "", fmt.Errorf("writing %s: %w", out, err)
	}
	return out, nil
}

// startRealNode plans one node and boots it. The returned node, if not
// nil, must be stopped even on error.
func (c *Cluster) startRealNode(ctx context.Context, n Node, cgroups realnode.Cgroups, clientCA string, archives []nodeimage.Archive) (*realNode, error) {
	kubeconfig, _, err := c.writeKubeconfig("kubelet-"+n.Name, envtest.User{Name: "system:node:" + n.Name, Groups: []string{"system:nodes"}})
	if err != nil {
		return nil, err
	}
	spec := realnode.Node{
		Name:         n.Name,
		IPs:          []string{n.IP, n.IPv6},
		PodCIDRs:     []string{n.PodCIDR, n.PodCIDRv6},
		Dir:          filepath.Join(c.opts.Dir, "nodes", n.Name),
		CgroupRoot:   path.Join(c.clusterCgroup(), n.Name),
		Kubeconfig:   kubeconfig,
		ClientCAFile: clientCA,
		SandboxImage: nodeimage.PauseRef,
		CNIBinDir:    realnode.DefaultCNIBinDir,
	}
	if c.opts.CoreDNS != "" {
		spec.ClusterDNS = ClusterDNSIP
	}
	files, err := realnode.WriteConfig(spec)
	if err != nil {
		return nil, err
	}
	rn := &realNode{spec: spec, files: files, cgroups: cgroups, node: n, binDir: c.opts.BinDir, logDir: filepath.Join(c.opts.Dir, "logs")}
	start := time.Now()
	if err := rn.boot(ctx, archives); err != nil {
		return rn, err
	}
	c.progressf("node %s: containerd and kubelet up in %s", n.Name, time.Since(start).Round(10*time.Millisecond))
	return rn, nil
}

// boot starts the node's processes: its mounts, containerd, the images
// (none on a reboot: containerd keeps them on disk), kubelet; it returns
// once kubelet answers its /healthz.
func (rn *realNode) boot(ctx context.Context, archives []nodeimage.Archive) error {
	n, files := rn.node, rn.files
	system := path.Join(rn.spec.CgroupRoot, "system")
	if err := rn.cgroups.Make(system); err != nil {
		return err
	}
	if err := os.Remove(files.Mounted); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	holder, err := startProcessOn(n.Host, n.Name+"-mounts", "unshare", []string{"--mount", "--propagation", "private", "/bin/sh", files.MountScript}, rn.logDir)
	if err != nil {
		return err
	}
	rn.holder = holder
	if err := rn.cgroups.Join(system, holder.pid()); err != nil {
		return err
	}
	if err := waitFor(ctx, 10*time.Second, holder, func() bool { _, err := os.Stat(files.Mounted); return err == nil }); err != nil {
		return fmt.Errorf("node %s: waiting for its mounts (%s): %w", n.Name, files.MountScript, err)
	}
	containerd, err := rn.enter("containerd-"+n.Name, filepath.Join(rn.binDir, "containerd"), "--config", files.ContainerdConfig)
	if err != nil {
		return err
	}
	sock := filepath.Join("/proc", strconv.Itoa(holder.pid()), "root", realnode.Socket)
	if err := waitFor(ctx, 30*time.Second, containerd, func() bool { _, err := os.Stat(sock); return err == nil }); err != nil {
		return fmt.Errorf("node %s: waiting for containerd's socket: %w", n.Name, err)
	}
	for _, a := range archives {
		if err := rn.importImage(ctx, a); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	kubelet, err := rn.enter("kubelet-"+n.Name, filepath.Join(rn.binDir, "kubelet"), realnode.KubeletArgs(rn.spec, files)...)
	if err != nil {
		return err
	}
	healthz := fmt.Sprintf("http://127.0.0.1:%d/healthz", realnode.KubeletHealthzPort)
	if err := waitFor(ctx, 60*time.Second, kubelet, func() bool { return httpOK(n.Host, healthz) }); err != nil {
		return fmt.Errorf("node %s: waiting for kubelet's %s: %w", n.Name, healthz, err)
	}
	return nil
}

// RebootNode restarts a real node as a machine's reboot does: every
// process of the node (kubelet, containerd, the shims, the pods'
// containers) is killed at once, the node stays off for down, its /run is
// emptied (a tmpfs on a real machine), and containerd and kubelet start
// again with their state on disk (images, kubelet's pod directories);
// kubelet then starts the node's pods again. The Node object and its pods
// stay in the API throughout, as they do for a reboot shorter than the
// node lifecycle controller's grace period.
func (c *Cluster) RebootNode(ctx context.Context, name string, down time.Duration) error {
	rn, err := c.realNode(name)
	if err != nil {
		return fmt.Errorf("rebooting node: %w", err)
	}
	if err := rn.stop(); err != nil {
		return fmt.Errorf("powering node %s off: %w", name, err)
	}
	select {
	case <-time.After(down):
	case <-ctx.Done():
		return ctx.Err()
	}
	run := filepath.Join(rn.spec.Dir, "root", "run")
	entries, err := os.ReadDir(run)
	if err != nil {
		return fmt.Errorf("emptying node %s's /run: %w", name, err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(run, e.Name())); err != nil {
			return fmt.Errorf("emptying node %s's /run: %w", name, err)
		}
		if err := os.MkdirAll(filepath.Join(run, e.Name()), 0o755); err != nil {
			return fmt.Errorf("emptying node %s's /run: %w", name, err)
		}
	}
	rn.holder, rn.procs = nil, nil
	if err := rn.boot(ctx, nil); err != nil {
		return fmt.Errorf("booting node %s again: %w", name, err)
	}
	c.progressf("node %s rebooted", name)
	return nil
}

// enter starts a program of the node: in its network namespace, its mount
// namespace (nsenter into the holder's) and its cgroup, with the tools
// directory first on PATH (containerd finds its shim there, runc after).
func (rn *realNode) enter(name, prog string, args ...string) (*process, error) {
	cmd := exec.Command("nsenter", rn.inMounts(prog, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(prog)+":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	p, err := startCommandOn(rn.node.Host, name, cmd, rn.logDir)
	if err != nil {
		return nil, err
	}
	rn.procs = append(rn.procs, p)
	// nsenter execs the program: the PID is the program's, and it has
	// forked nothing yet.
	if err := rn.cgroups.Join(path.Join(rn.spec.CgroupRoot, "system"), p.pid()); err != nil {
		return p, err
	}
	return p, nil
}

// inMounts is nsenter's arguments to run prog with args in the node's
// mount namespace (the holder's).
func (rn *realNode) inMounts(prog string, args ...string) []string {
	return append([]string{"--mount=/proc/" + strconv.Itoa(rn.holder.pid()) + "/ns/mnt", "--", prog}, args...)
}

// importImage imports an archive into the node's containerd, in the
// namespace the CRI plugin serves (k8s.io), and names each image by its
// manifest's digest too (repository@sha256:...), as a pull by digest would:
// ctr's --digests names the archive's index instead, which no pod asks for.
func (rn *realNode) importImage(ctx context.Context, a nodeimage.Archive) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ctr := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "nsenter", rn.inMounts(filepath.Join(rn.binDir, "ctr"), append([]string{"--address", realnode.Socket, "--namespace", "k8s.io"}, args...)...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := ctr("images", "import", "--base-name", a.Repository, a.Path); err != nil {
		return fmt.Errorf("importing %s into containerd: %w", strings.Join(a.Refs, ", "), err)
	}
	for i, ref := range a.Refs {
		if err := ctr("images", "tag", "--force", ref, a.Repository+"@"+a.Digests[i]); err != nil {
			return fmt.Errorf("naming %s by its digest: %w", ref, err)
		}
	}
	return nil
}

// stop powers the node off: every process in its cgroup (kubelet,
// containerd, the shims, the pods' containers) is killed at once, then the
// cgroups go.
func (rn *realNode) stop() error {
	var errs []error
	if err := rn.cgroups.Remove(rn.spec.CgroupRoot, 30*time.Second); err != nil {
		errs = append(errs, err)
	}
	// Processes that never reached the cgroup.
	for _, p := range append([]*process{rn.holder}, rn.procs...) {
		if p != nil {
			errs = append(errs, p.stop(5*time.Second))
		}
	}
	return errors.Join(errs...)
}

// waitFor polls ok every 50 ms until it holds, p exits or timeout passes;
// the error of either failure ends with the last lines of p's log.
func waitFor(ctx context.Context, timeout time.Duration, p *process, ok func() bool) error {
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		if done, err := p.exited(); done {
			return false, err
		}
		return ok(), nil
	})
	if err != nil {
		return fmt.Errorf("%w; last lines of %s:\n%s", err, p.logPath, LogTail(p.logPath, 20))
	}
	return nil
}

// httpOK says whether a GET of url from the host answers 200.
func httpOK(h *network.Host, url string) bool {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: h.DialContext}}
	resp, err := client.Get(url)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// LogTail is the last n lines of a log file, for error messages.
func LogTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WriteStaticPod runs pod as a static pod of real node name, as an
// administrator does by writing a manifest into kubelet's staticPodPath:
// kubelet starts it and creates its mirror pod (named pod.Name-<node>).
// The manifest is written under a hidden name and renamed, since kubelet
// ignores hidden files and would otherwise read a half-written one.
// RemoveStaticPod takes it away again.
func (c *Cluster) WriteStaticPod(name string, pod *corev1.Pod) error {
	rn, err := c.realNode(name)
	if err != nil {
		return fmt.Errorf("writing static pod %s: %w", pod.Name, err)
	}
	p := pod.DeepCopy()
	p.APIVersion, p.Kind = "v1", "Pod"
	data, err := yaml.Marshal(p)
	if err != nil {
		return fmt.Errorf("writing static pod %s: %w", pod.Name, err)
	}
	final := filepath.Join(rn.files.StaticPods, pod.Name+".yaml")
	tmp := filepath.Join(rn.files.StaticPods, "."+pod.Name+".yaml")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("writing static pod %s: %w", pod.Name, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("writing static pod %s: %w", pod.Name, err)
	}
	return nil
}

// RemoveStaticPod removes the manifest WriteStaticPod wrote: kubelet stops
// the pod and deletes its mirror.
func (c *Cluster) RemoveStaticPod(name, pod string) error {
	rn, err := c.realNode(name)
	if err != nil {
		return fmt.Errorf("removing static pod %s: %w", pod, err)
	}
	if err := os.Remove(filepath.Join(rn.files.StaticPods, pod+".yaml")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing static pod %s: %w", pod, err)
	}
	return nil
}

// realNode is the real node of that name.
func (c *Cluster) realNode(name string) (*realNode, error) {
	for _, r := range c.realNodes {
		if r.spec.Name == name {
			return r, nil
		}
	}
	return nil, fmt.Errorf("node %s is not a real node of this cluster (Options.RealKubelets)", name)
}

// PodHost opens the network namespace of a pod that has one of its own,
// to reach what it serves on its loopback only (ebb controller's metrics):
// on a simulated node, the namespace the pod runner made (close is a
// no-op: the cluster keeps it); on a real node, the one the CNI plugin
// made, found through a process of the pod in its cgroup (kubelet's
// cgroupfs layout: <cgroupRoot>/kubepods[/<qos>]/pod<uid>/<container>).
func (c *Cluster) PodHost(pod *corev1.Pod) (h *network.Host, close func(), err error) {
	name := pod.Namespace + "/" + pod.Name
	if h, ok := c.Network.Host(name); ok {
		return h, func() {}, nil
	}
	rn, err := c.realNode(pod.Spec.NodeName)
	if err != nil {
		return nil, nil, fmt.Errorf("pod %s has no network namespace of its own: %w", name, err)
	}
	pid, err := rn.podProcess(pod)
	if err != nil {
		return nil, nil, fmt.Errorf("finding a process of pod %s: %w", name, err)
	}
	h, err = network.OpenHost(name, fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, nil, err
	}
	return h, h.Close, nil
}

// podProcess finds a process of the pod (its sandbox's or a container's).
func (rn *realNode) podProcess(pod *corev1.Pod) (int, error) {
	pids, err := rn.podProcesses(pod)
	if err != nil {
		return 0, err
	}
	return pids[0], nil
}

// podProcesses lists the processes of the pod (its sandbox's and its
// containers') in the node's cgroups: kubelet makes the pod's cgroup in
// every hierarchy, and the first that has it will do.
func (rn *realNode) podProcesses(pod *corev1.Pod) ([]int, error) {
	want := "pod" + string(pod.UID)
	for _, mount := range rn.cgroups.Mounts {
		root := filepath.Join(mount, rn.spec.CgroupRoot, "kubepods")
		var pids []int
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() || !strings.Contains(p, want) || d.Name() == want {
				return nil // unreadable (gone meanwhile), or not one of the pod's containers
			}
			data, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for _, line := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(line); err == nil {
					pids = append(pids, pid)
				}
			}
			return nil
		})
		if len(pids) > 0 {
			return pids, nil
		}
	}
	return nil, fmt.Errorf("no process of the pod in the cgroups %s under %s/kubepods", want, rn.spec.CgroupRoot)
}
