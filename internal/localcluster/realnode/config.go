// Package realnode writes what a real node of the local cluster runs: the
// configuration of its containerd (CRI) and kubelet, its CNI network, and
// the script that gives the node a mount namespace of its own. The cluster
// (localcluster) starts the processes; this package only decides their
// files and arguments.
//
// A node is a network namespace (made by localcluster's network), a mount
// namespace held by a small process, and a cgroup root in every cgroup v1
// hierarchy. kubelet and containerd hard-code a few paths (the device-plugin
// socket under /var/lib/kubelet, the shims' sockets under /run/containerd,
// the pod log links under /var/log) and write six system-wide sysctls; the
// node's mount namespace binds a directory of its own over each of those
// paths and a regular file over each of those sysctls, so nodes do not
// collide and the machine keeps its values.
package realnode

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// ClusterDomain is the cluster's DNS domain when it runs DNS.
const ClusterDomain = "cluster.local"

// Node is a real node's plan.
type Node struct {
	// Name is the node's name (kubelet's --hostname-override).
	Name string
	// IPs are its InternalIPs, IPv4 first.
	IPs []string
	// PodCIDRs are its pod ranges, IPv4 first (the CNI plugin's IPAM).
	PodCIDRs []string
	// Dir is the node's own directory (absolute).
	Dir string
	// CgroupRoot is the node's cgroup, e.g. /ebb/e2e-kubelet/node-1
	// (kubelet's cgroupRoot; containerd, kubelet and the pods go under it).
	CgroupRoot string
	// Kubeconfig is kubelet's kubeconfig (system:node:<Name>).
	Kubeconfig string
	// ClientCAFile holds the CAs kubelet trusts for clients (the
	// apiserver's kubelet client certificate is signed by one of them).
	ClientCAFile string
	// SandboxImage is containerd's pinned pod sandbox image.
	SandboxImage string
	// CNIBinDir holds the CNI reference plugins (Debian:
	// /usr/lib/cni).
	CNIBinDir string
	// ClusterDNS is the cluster DNS Service's address that pods resolve
	// names with (kubelet's clusterDNS, domain cluster.local); empty when
	// the cluster runs no DNS.
	ClusterDNS string
}

// Bound are the paths kubelet and containerd hard-code, each bound to a
// directory of the node's own (under Dir/root) in its mount namespace.
var Bound = []string{"/var/lib/kubelet", "/var/lib/cni", "/var/lib/containerd", "/run/containerd", "/var/log"}

// sysctls are the system-wide sysctls kubelet sets at start (its
// setupKernelTunables, with protectKernelDefaults off), with the values it
// writes; a regular file of the node's own is bound over each.
var sysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// Socket is containerd's socket inside the node's mount namespace (its
// default: /run/containerd is the node's own there).
const Socket = "/run/containerd/containerd.sock"

// KubeletPort is kubelet's port, on the node's IPs.
const KubeletPort = 10250

// KubeletHealthzPort is kubelet's /healthz, on the node's loopback.
const KubeletHealthzPort = 10248

// Files are the paths of what WriteConfig wrote.
type Files struct {
	// MountScript gives the node its mounts, then waits (its process holds
	// the mount namespace); it touches Mounted when done.
	MountScript, Mounted string
	// ContainerdConfig and KubeletConfig are the daemons' configurations.
	ContainerdConfig, KubeletConfig string
	// StaticPods is kubelet's staticPodPath: a pod manifest written there
	// runs as a static pod, with its mirror pod in the API (created by
	// kubelet, as on any node that runs its control plane so).
	StaticPods string
}

// WriteConfig writes the node's files under n.Dir.
func WriteConfig(n Node) (Files, error) {
	f := Files{
		MountScript:      filepath.Join(n.Dir, "mounts.sh"),
		Mounted:          filepath.Join(n.Dir, "mounted"),
		ContainerdConfig: filepath.Join(n.Dir, "containerd.toml"),
		KubeletConfig:    filepath.Join(n.Dir, "kubelet.yaml"),
		StaticPods:       filepath.Join(n.Dir, "manifests"),
	}
	for _, d := range []string{"root", "sysctl", "cni", "manifests"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return Files{}, fmt.Errorf("creating the directory of node %s: %w", n.Name, err)
		}
	}
	script, err := mountScript(n, f.Mounted)
	if err != nil {
		return Files{}, err
	}
	cni, err := cniConfig(n)
	if err != nil {
		return Files{}, err
	}
	kubelet, err := kubeletConfig(n, f.StaticPods)
	if err != nil {
		return Files{}, err
	}
	files := map[string][]byte{
		f.MountScript:      script,
		f.ContainerdConfig: containerdConfig(n),
		f.KubeletConfig:    kubelet,
		filepath.Join(n.Dir, "cni", "10-ebb.conflist"): cni,
	}
	for path, data := range files {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return Files{}, fmt.Errorf("writing %s: %w", path, err)
		}
	}
	return f, nil
}

// mountScript binds the node's directories and sysctl files, then execs
// a sleep that holds the namespace. It runs under `unshare --mount
// --propagation private`.
func mountScript(n Node, mounted string) ([]byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "#!/bin/sh\n# The mounts of node %s's own mount namespace (internal/localcluster/realnode).\nset -eu\n", n.Name)
	for _, p := range Bound {
		own := filepath.Join(n.Dir, "root", strings.TrimPrefix(p, "/"))
		if err := os.MkdirAll(own, 0o755); err != nil {
			return nil, fmt.Errorf("creating %s: %w", own, err)
		}
		// The mount point must exist; on a machine without it, an empty
		// directory is left behind (the node's files never are).
		fmt.Fprintf(&b, "mkdir -p %s\nmount --bind %s %s\n", p, own, p)
	}
	for name, value := range sysctls {
		own := filepath.Join(n.Dir, "sysctl", strings.ReplaceAll(name, "/", "."))
		if err := os.WriteFile(own, []byte(value+"\n"), 0o644); err != nil {
			return nil, fmt.Errorf("writing %s: %w", own, err)
		}
		fmt.Fprintf(&b, "mount --bind %s /proc/sys/%s\n", own, name)
	}
	fmt.Fprintf(&b, "touch %s\nexec sleep infinity\n", mounted)
	return []byte(b.String()), nil
}

// containerdConfig is containerd 2's configuration (version 3) for the
// node: its root under Dir, its state and socket in the node's own
// /run/containerd; runc with cgroupfs (cgroup v1); no AppArmor; and
// restrict_oom_score_adj, because nothing here may lower oom_score_adj
// (CAP_SYS_RESOURCE is not in the bounding set) and runc fails every
// sandbox that asks to.
func containerdConfig(n Node) []byte {
	return []byte(fmt.Sprintf(`# containerd of node %[1]s (internal/localcluster/realnode).
version = 3
root = %[2]q
state = "/run/containerd"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[3]q

[ttrpc]
  address = "/run/containerd/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = %[5]q

[plugins."io.containerd.cri.v1.runtime"]
  disable_apparmor = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "/run/containerd/runc"

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = [%[6]q]
  conf_dir = %[7]q
`, n.Name, filepath.Join(n.Dir, "root", "var/lib/containerd"), Socket, filepath.Join(n.Dir, "opt"), n.SandboxImage, n.CNIBinDir, filepath.Join(n.Dir, "cni")))
}

// cniConfig is the node's pod network: the ptp plugin (a veth per pod and
// a host route to it, no bridge) with host-local addresses from the node's
// pod ranges. Pod ranges are routed to their nodes by the cluster's
// network, as a host-gateway CNI does. A bridge would need br_netfilter
// for a pod to reach a Service whose endpoint is on the same node (the
// reply would not pass kube-proxy's rules), and this machine cannot load
// modules.
func cniConfig(n Node) ([]byte, error) {
	var ranges [][]map[string]string
	var routes []map[string]string
	for _, c := range n.PodCIDRs {
		ranges = append(ranges, []map[string]string{{"subnet": c}})
		if strings.Contains(c, ":") {
			routes = append(routes, map[string]string{"dst": "::/0"})
		} else {
			routes = append(routes, map[string]string{"dst": "0.0.0.0/0"})
		}
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "ebb-local",
		"plugins": []any{map[string]any{
			"type":   "ptp",
			"ipMasq": false,
			"mtu":    1500,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  ranges,
				"routes":  routes,
				"dataDir": "/var/lib/cni/networks",
			},
		}},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("writing the CNI configuration of %s: %w", n.Name, err)
	}
	return data, nil
}

// kubeletConfig is the node's KubeletConfiguration, with static pods read
// from staticPods.
func kubeletConfig(n Node, staticPods string) ([]byte, error) {
	conf := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		// cgroup v1 is what this machine has; kubelet 1.36 refuses it
		// unless told.
		"failCgroupV1":             false,
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               n.CgroupRoot,
		"containerRuntimeEndpoint": "unix://" + Socket,
		"address":                  n.IPs[0],
		"port":                     KubeletPort,
		"readOnlyPort":             0,
		"healthzBindAddress":       "127.0.0.1",
		"healthzPort":              KubeletHealthzPort,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": n.ClientCAFile},
		},
		"authorization": map[string]any{"mode": "Webhook"},
		"staticPodPath": staticPods,
		// A manifest written there is seen at the next look (20 s by
		// default); tests want it sooner.
		"fileCheckFrequency": "2s",
		// The cluster runs no DNS; pods get the node's view of none.
		"resolvConf":   "",
		"failSwapOn":   true,
		"maxPods":      110,
		"podPidsLimit": 4096,
		// The machine's disk is shared with everything else: never
		// garbage-collect the images nodes cannot pull again, and evict
		// only when memory or disk is really short.
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"evictionHard": map[string]string{
			"memory.available":   "100Mi",
			"nodefs.available":   "1%",
			"nodefs.inodesFree":  "1%",
			"imagefs.available":  "1%",
			"imagefs.inodesFree": "1%",
		},
		"systemReserved":        map[string]string{"cpu": "100m", "memory": "256Mi"},
		"serializeImagePulls":   false,
		"protectKernelDefaults": false,
	}
	if n.ClusterDNS != "" {
		conf["clusterDNS"] = []string{n.ClusterDNS}
		conf["clusterDomain"] = ClusterDomain
	}
	data, err := yaml.Marshal(conf)
	if err != nil {
		return nil, fmt.Errorf("writing the kubelet configuration of %s: %w", n.Name, err)
	}
	return data, nil
}

// KubeletArgs are kubelet's flags for the node.
func KubeletArgs(n Node, f Files) []string {
	return []string{
		"--config=" + f.KubeletConfig,
		"--kubeconfig=" + n.Kubeconfig,
		"--hostname-override=" + n.Name,
		"--node-ip=" + strings.Join(n.IPs, ","),
	}
}
