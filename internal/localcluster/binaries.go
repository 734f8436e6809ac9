package localcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// EnvToolsBin names the directory holding the pinned control-plane binaries
// (kube-apiserver, kube-controller-manager, kube-scheduler, etcd, kwok,
// kubectl and kwok-stages/). `make tools` prints it.
const EnvToolsBin = "EBB_TOOLS_BIN"

// requiredBinaries are the programs a cluster starts.
var requiredBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kwok", "kubectl",
	// The real nodes' (Options.RealKubelets).
	"kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "pause", "agnhost"}

// FindBinDir returns the directory of the pinned binaries, looking in
// turn at:
//  1. $EBB_TOOLS_BIN;
//  2. the enclosing ebb checkout's hack/tools.sh, which builds whatever is
//     missing (progress on stderr) and caches the result;
//  3. outside a checkout, the tools cache hack/tools.sh fills
//     ($EBB_CACHE, else $XDG_CACHE_HOME/ebb or ~/.cache/ebb, then
//     tools/*/bin): the newest directory holding every binary.
//
// Commands that start a cluster also take --tools-bin, which wins over all
// of these.
func FindBinDir() (string, error) {
	dir := os.Getenv(EnvToolsBin)
	if dir == "" {
		var err error
		if dir, err = toolsFromCheckout(); errors.Is(err, errNoCheckout) {
			dir, err = toolsFromCache()
		}
		if err != nil {
			return "", err
		}
	}
	if err := CheckBinDir(dir); err != nil {
		return "", err
	}
	return dir, nil
}

// CheckBinDir says which required binary dir lacks, if any.
func CheckBinDir(dir string) error {
	for _, b := range requiredBinaries {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return fmt.Errorf("%s not found in %s: run `make tools` and pass the directory it prints with --tools-bin or %s", b, dir, EnvToolsBin)
		}
	}
	return nil
}

var errNoCheckout = errors.New("not in an ebb checkout")

// toolsFromCheckout runs the enclosing checkout's hack/tools.sh.
func toolsFromCheckout() (string, error) {
	script, err := findToolsScript()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(script)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("building the local cluster's tools with %s: %w", script, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}

// ToolsCache is where hack/tools.sh caches its builds.
func ToolsCache() string {
	if d := os.Getenv("EBB_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "ebb")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "ebb")
	}
	return filepath.Join(home, ".cache", "ebb")
}

// toolsFromCache returns the newest complete tools directory in the cache.
func toolsFromCache() (string, error) {
	dirs, _ := filepath.Glob(filepath.Join(ToolsCache(), "tools", "*", "bin"))
	best, bestTime := "", time.Time{}
	for _, d := range dirs {
		if CheckBinDir(d) != nil {
			continue
		}
		info, err := os.Stat(filepath.Join(d, "kube-apiserver"))
		if err == nil && info.ModTime().After(bestTime) {
			best, bestTime = d, info.ModTime()
		}
	}
	if best == "" {
		return "", fmt.Errorf("control-plane binaries not found: not in an ebb checkout, and no complete build in %s; run `make tools` in a checkout and pass the directory it prints with --tools-bin or %s", filepath.Join(ToolsCache(), "tools"), EnvToolsBin)
	}
	return best, nil
}

// findToolsScript walks up from the working directory to the checkout's
// hack/tools.sh.
func findToolsScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the working directory: %w", err)
	}
	for {
		script := filepath.Join(dir, "hack", "tools.sh")
		if _, err := os.Stat(script); err == nil {
			return script, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errNoCheckout
		}
		dir = parent
	}
}
