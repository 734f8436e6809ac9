package realnode

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func testNode(t *testing.T) Node {
	return Node{
		Name:         "node-1",
		IPs:          []string{"10.0.0.1", "fd00:10::1"},
		PodCIDRs:     []string{"10.244.1.0/24", "fd00:244:0:1::/64"},
		Dir:          t.TempDir(),
		CgroupRoot:   "/ebb/test/node-1",
		Kubeconfig:   "/k/kubelet.kubeconfig",
		ClientCAFile: "/k/ca.crt",
		SandboxImage: "registry.k8s.io/pause:3.10.2",
		CNIBinDir:    DefaultCNIBinDir,
	}
}

func TestWriteConfigBindsEveryHardCodedPathAndSysctl(t *testing.T) {
	n := testNode(t)
	f, err := WriteConfig(n)
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(f.MountScript)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range Bound {
		own := filepath.Join(n.Dir, "root", strings.TrimPrefix(p, "/"))
		if !strings.Contains(string(script), "mount --bind "+own+" "+p+"\n") {
			t.Errorf("the mount script does not bind %s over %s:\n%s", own, p, script)
		}
		if fi, err := os.Stat(own); err != nil || !fi.IsDir() {
			t.Errorf("the node's own %s was not created: %v", own, err)
		}
	}
	for name, value := range sysctls {
		own := filepath.Join(n.Dir, "sysctl", strings.ReplaceAll(name, "/", "."))
		if !strings.Contains(string(script), "mount --bind "+own+" /proc/sys/"+name+"\n") {
			t.Errorf("the mount script does not bind a file over /proc/sys/%s", name)
		}
		if got, _ := os.ReadFile(own); strings.TrimSpace(string(got)) != value {
			t.Errorf("%s holds %q, want kubelet's value %q", own, got, value)
		}
	}
	// The holder must touch the marker only after every mount, then hold.
	if !strings.HasSuffix(string(script), "touch "+f.Mounted+"\nexec sleep infinity\n") {
		t.Errorf("the mount script does not end by marking the mounts done and holding the namespace:\n%s", script)
	}
}

// writtenKubeletConfig writes n's files and reads back kubelet's
// configuration.
func writtenKubeletConfig(t *testing.T, n Node) (Files, map[string]any) {
	t.Helper()
	f, err := WriteConfig(n)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(f.KubeletConfig)
	if err != nil {
		t.Fatal(err)
	}
	var conf map[string]any
	if err := yaml.Unmarshal(data, &conf); err != nil {
		t.Fatal(err)
	}
	return f, conf
}

func TestKubeletConfigIsForThisMachine(t *testing.T) {
	n := testNode(t)
	f, conf := writtenKubeletConfig(t, n)
	for key, want := range map[string]any{
		"failCgroupV1":             false,
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               n.CgroupRoot,
		"containerRuntimeEndpoint": "unix://" + Socket,
		"address":                  "10.0.0.1",
		"readOnlyPort":             float64(0),
		"resolvConf":               "",
		"staticPodPath":            f.StaticPods,
	} {
		if conf[key] != want {
			t.Errorf("kubelet's %s = %v, want %v", key, conf[key], want)
		}
	}
	auth, _ := conf["authentication"].(map[string]any)
	x509, _ := auth["x509"].(map[string]any)
	if x509["clientCAFile"] != n.ClientCAFile {
		t.Errorf("kubelet trusts client CA %v, want %s", x509["clientCAFile"], n.ClientCAFile)
	}
	args := strings.Join(KubeletArgs(n, f), " ")
	for _, want := range []string{"--node-ip=10.0.0.1,fd00:10::1", "--hostname-override=node-1", "--kubeconfig=/k/kubelet.kubeconfig"} {
		if !strings.Contains(args, want) {
			t.Errorf("kubelet's flags %q lack %s", args, want)
		}
	}
}

func TestKubeletConfigNamesTheClusterDNSOnlyWhenThereIsOne(t *testing.T) {
	for _, dns := range []string{"", "10.96.0.10"} {
		n := testNode(t)
		n.ClusterDNS = dns
		_, conf := writtenKubeletConfig(t, n)
		servers, _ := conf["clusterDNS"].([]any)
		switch {
		case dns == "" && (conf["clusterDNS"] != nil || conf["clusterDomain"] != nil):
			t.Errorf("no cluster DNS, but kubelet's clusterDNS %v, clusterDomain %v", conf["clusterDNS"], conf["clusterDomain"])
		case dns != "" && (len(servers) != 1 || servers[0] != dns || conf["clusterDomain"] != ClusterDomain):
			t.Errorf("cluster DNS %s: kubelet's clusterDNS %v, clusterDomain %v", dns, conf["clusterDNS"], conf["clusterDomain"])
		}
	}
}

func TestCNIConfigAddressesBothFamiliesOfTheNode(t *testing.T) {
	n := testNode(t)
	if _, err := WriteConfig(n); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(n.Dir, "cni", "10-ebb.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Plugins []struct {
			Type string
			IPAM struct {
				Ranges [][]struct{ Subnet string }
				Routes []struct{ Dst string }
			}
		}
	}
	if err := json.Unmarshal(data, &conf); err != nil {
		t.Fatal(err)
	}
	if len(conf.Plugins) != 1 || conf.Plugins[0].Type != "ptp" {
		t.Fatalf("plugins %+v, want ptp alone", conf.Plugins)
	}
	ipam := conf.Plugins[0].IPAM
	if len(ipam.Ranges) != 2 || ipam.Ranges[0][0].Subnet != n.PodCIDRs[0] || ipam.Ranges[1][0].Subnet != n.PodCIDRs[1] {
		t.Errorf("ranges %+v, want the node's %v", ipam.Ranges, n.PodCIDRs)
	}
	if len(ipam.Routes) != 2 || ipam.Routes[0].Dst != "0.0.0.0/0" || ipam.Routes[1].Dst != "::/0" {
		t.Errorf("routes %+v, want a default route per family", ipam.Routes)
	}
}

func TestContainerdConfigKeepsTheNodesState(t *testing.T) {
	n := testNode(t)
	f, err := WriteConfig(n)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(f.ContainerdConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"version = 3",
		`root = "` + filepath.Join(n.Dir, "root", "var/lib/containerd") + `"`,
		`address = "` + Socket + `"`,
		`sandbox = "registry.k8s.io/pause:3.10.2"`,
		"restrict_oom_score_adj = true",
		"SystemdCgroup = false",
		`conf_dir = "` + filepath.Join(n.Dir, "cni") + `"`,
	} {
		if !strings.Contains(string(data), want) {
			t.Errorf("containerd's configuration lacks %s:\n%s", want, data)
		}
	}
}

func TestRemoveRefusesCgroupsThatAreNotANodes(t *testing.T) {
	c := Cgroups{Mounts: []string{t.TempDir()}}
	for _, path := range []string{"/", "", "/ebb", "/ebb/", "/ebb/.", "/ebb//x", "/ebb/x/", "/system.slice", "/ebb/../user.slice", "ebb/x"} {
		if err := c.Remove(path, time.Second); err == nil {
			t.Errorf("Remove(%q) = nil: it would kill processes that are not a node's", path)
		}
	}
	if err := c.Remove("/ebb/test/node-1", time.Second); err != nil {
		t.Errorf("Remove of a node's cgroup that does not exist: %v, want nil", err)
	}
}

func TestMakeCopiesCpusetsDownEveryLevel(t *testing.T) {
	cpuset, memory := t.TempDir(), t.TempDir()
	for f, v := range map[string]string{"cpuset.cpus": "0-1\n", "cpuset.mems": "0\n"} {
		if err := os.WriteFile(filepath.Join(cpuset, f), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := Cgroups{Mounts: []string{cpuset, memory}}
	if err := c.Make("/ebb/test/node-1/system"); err != nil {
		t.Fatal(err)
	}
	for _, level := range []string{"ebb", "ebb/test", "ebb/test/node-1", "ebb/test/node-1/system"} {
		if got, _ := os.ReadFile(filepath.Join(cpuset, level, "cpuset.cpus")); string(got) != "0-1\n" {
			t.Errorf("%s's cpuset.cpus = %q, want the parent's", level, got)
		}
		if fi, err := os.Stat(filepath.Join(memory, level)); err != nil || !fi.IsDir() {
			t.Errorf("%s missing in the memory hierarchy: %v", level, err)
		}
		if _, err := os.Stat(filepath.Join(memory, level, "cpuset.cpus")); err == nil {
			t.Errorf("%s of the memory hierarchy got a cpuset file", level)
		}
	}
	// Again: the cgroups exist, which is fine; one a crash left without
	// its cpuset gets it.
	if err := os.WriteFile(filepath.Join(cpuset, "ebb/test/node-1/cpuset.cpus"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Make("/ebb/test/node-1/system"); err != nil {
		t.Errorf("Make of existing cgroups: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(cpuset, "ebb/test/node-1/cpuset.cpus")); string(got) != "0-1\n" {
		t.Errorf("an existing cgroup without cpus got %q, want the parent's", got)
	}
}

func TestRemoveStaleRemovesOnlyOldEmptyClusters(t *testing.T) {
	mount := t.TempDir()
	c := Cgroups{Mounts: []string{mount}}
	old := time.Now().Add(-time.Hour)
	for _, tree := range []string{"crashed/node-1/system", "running/node-1/system", "elsewhere/node-1/system", "starting/node-1"} {
		if err := os.MkdirAll(filepath.Join(mount, CgroupParent, tree), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A running cluster has processes (this test's own, never killed: it
	// is skipped); one being made now has none yet, but is new.
	if err := os.WriteFile(filepath.Join(mount, CgroupParent, "running/node-1/system/cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	// Another cluster's processes are in another PID namespace: its
	// cgroup.procs lists them as 0.
	if err := os.WriteFile(filepath.Join(mount, CgroupParent, "elsewhere/node-1/system/cgroup.procs"), []byte("0\n0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"crashed", "running", "elsewhere"} {
		if err := os.Chtimes(filepath.Join(mount, CgroupParent, d), old, old); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.RemoveStale(); err != nil {
		t.Fatal(err)
	}
	for tree, want := range map[string]bool{"crashed": false, "running": true, "elsewhere": true, "starting": true} {
		_, err := os.Stat(filepath.Join(mount, CgroupParent, tree))
		if got := err == nil; got != want {
			t.Errorf("%s kept = %v, want %v", tree, got, want)
		}
	}
}
