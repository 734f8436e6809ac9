package localcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// EnvToolsBin names the directory holding the pinned control-plane binaries
// (kube-apiserver, kube-controller-manager, kube-scheduler, etcd, kwok,
// kubectl and kwok-stages/). `make tools` prints it.
const EnvToolsBin = "EBB_TOOLS_BIN"

// requiredBinaries are the programs a cluster starts.
var requiredBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kwok", "kubectl"}

// FindBinDir returns the directory of the pinned binaries: $EBB_TOOLS_BIN, or
// else the one hack/tools.sh of the enclosing ebb checkout builds (it builds
// whatever is missing, printing progress to stderr, and caches the result).
func FindBinDir() (string, error) {
	dir := os.Getenv(EnvToolsBin)
	if dir == "" {
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
		dir = lines[len(lines)-1]
	}
	for _, b := range requiredBinaries {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s not found in %s (%s): run `make tools` and set %s to the directory it prints", b, dir, EnvToolsBin, EnvToolsBin)
		}
	}
	return dir, nil
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
			return "", errors.New("control-plane binaries not found: set " + EnvToolsBin + " to the directory `make tools` prints, or run from an ebb checkout")
		}
		dir = parent
	}
}
