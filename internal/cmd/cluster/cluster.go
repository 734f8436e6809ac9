// Package cluster implements `ebb cluster up|down|exec`: a developer's handle
// on the local cluster of internal/localcluster, left running in the
// background in its own namespace.
package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

// Options are the flags every cluster subcommand shares.
type Options struct {
	// Name names the cluster; its state lives in StateRoot/Name.
	Name string
	// StateRoot holds the state directories of all clusters.
	StateRoot string
	// ToolsBin holds the control-plane binaries (default:
	// localcluster.FindBinDir).
	ToolsBin string
}

// NewCommand returns `ebb cluster`.
func NewCommand() *cobra.Command {
	o := &Options{}
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Run a real local Kubernetes cluster (kube-apiserver, etcd, controllers, kwok nodes) for development",
		Long: `Run a real local Kubernetes cluster for development and experiments.

The cluster runs in its own user and network namespace: node IPs (10.0.0.0/24),
pod IPs (10.244.0.0/16) and load-balancer VIPs (10.96.240.0/20) exist only
there. Use "ebb cluster exec" to run commands (kubectl, curl) inside it.`,
	}
	cmd.PersistentFlags().StringVar(&o.Name, "name", "ebb", "name of the cluster")
	cmd.PersistentFlags().StringVar(&o.StateRoot, "state-dir", DefaultStateRoot(), "directory holding the clusters' state")
	cmd.PersistentFlags().StringVar(&o.ToolsBin, "tools-bin", "", "directory of the control-plane binaries `make tools` prints (default: $EBB_TOOLS_BIN, the checkout's hack/tools.sh, then the newest build in the tools cache)")
	cmd.AddCommand(newUpCommand(o), newDownCommand(o), newExecCommand(o), newServeCommand(o))
	return cmd
}

func DefaultStateRoot() string {
	if d := os.Getenv("EBB_STATE_DIR"); d != "" {
		return d
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	return filepath.Join(cache, "ebb", "clusters")
}

// dir is the state directory of the named cluster.
func (o *Options) dir() string { return filepath.Join(o.StateRoot, o.Name) }

// validate checks the name before it becomes a path.
func (o *Options) validate() error {
	if o.Name == "" || strings.ContainsAny(o.Name, `/\`) || o.Name == "." || o.Name == ".." {
		return fmt.Errorf("invalid cluster name %q: use letters, digits and dashes", o.Name)
	}
	return nil
}

// Files in a cluster's state directory.
const (
	pidFile    = "pid"
	readyFile  = "ready"
	binDirFile = "bin-dir"
	serveLog   = "serve.log"
	kubeconfig = "admin.kubeconfig"
)

// runningPID returns the PID of the cluster's supervisor, or 0 if it does
// not run.
func (o *Options) runningPID() (int, error) {
	data, err := os.ReadFile(filepath.Join(o.dir(), pidFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the cluster's pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("corrupt pid file %s: %w", filepath.Join(o.dir(), pidFile), err)
	}
	if !alive(pid) {
		return 0, nil
	}
	return pid, nil
}

// alive reports whether pid runs (a zombie does not count).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name: "pid (comm) S ...".
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// waitGone waits until pid has exited, up to timeout.
func waitGone(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !alive(pid) {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return !alive(pid)
}

// RegisterPID records pid as the process running cluster name, so that
// `ebb cluster exec --name NAME` and `down` find it (`ebb demo --keep`).
func RegisterPID(stateRoot, name string, pid int) error {
	dir := filepath.Join(stateRoot, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(dir, readyFile))
	return os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(pid)+"\n"), 0o644)
}

// MarkReady records that the cluster in dir serves, with its tools in
// binDir.
func MarkReady(dir, binDir string) error {
	if err := os.WriteFile(filepath.Join(dir, binDirFile), []byte(binDir+"\n"), 0o644); err != nil {
		return fmt.Errorf("writing the tools directory: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, readyFile), nil, 0o644)
}
