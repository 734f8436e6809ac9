package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

func newUpCommand(o *Options) *cobra.Command {
	var nodes int
	var realKubelets bool
	var timeout time.Duration
	var withEbb bool
	var install string
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start a local cluster in the background and wait until it is ready",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			if nodes < 1 || nodes > 250 {
				return fmt.Errorf("--nodes must be between 1 and 250, not %d", nodes)
			}
			if withEbb && install != "" {
				return errors.New("--with-ebb and --install both install ebb: give one")
			}
			if withEbb || install != "" {
				manifest, err := ebbrun.FindManifest(install)
				if err != nil {
					return err
				}
				install = manifest
			}
			return o.up(cmd.Context(), nodes, timeout, install, realKubelets)
		},
	}
	cmd.Flags().BoolVar(&realKubelets, "real-kubelets", false, "make every node a real one: the upstream kubelet and containerd, pods of real images (needs root; see docs/local-cluster.md)")
	cmd.Flags().BoolVar(&withEbb, "with-ebb", false, "install ebb from the manifest `make release` writes ($EBB_DIST/install.yaml, else dist/install.yaml of this binary's checkout): --install with its default")
	cmd.Flags().StringVar(&install, "install", "", "install ebb from this manifest (dist/install.yaml; its image layout is the oci directory next to it) as pods of ebb's image, with ebb lb on the first node")
	cmd.Flags().IntVar(&nodes, "nodes", 3, "number of simulated nodes")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the cluster to be ready (building the tools first is not counted)")
	return cmd
}

func (o *Options) up(ctx context.Context, nodes int, timeout time.Duration, install string, realKubelets bool) error {
	if pid, err := o.runningPID(); err != nil {
		return err
	} else if pid != 0 {
		return fmt.Errorf("cluster %q is already running (pid %d): use it, or stop it with `ebb cluster down --name %s`", o.Name, pid, o.Name)
	}
	binDir := o.ToolsBin
	if binDir == "" {
		var err error
		if binDir, err = localcluster.FindBinDir(); err != nil {
			return err
		}
	} else if err := localcluster.CheckBinDir(binDir); err != nil {
		return err
	}
	dir := o.dir()
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("clearing the old state of cluster %q: %w", o.Name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	logFile, err := os.Create(filepath.Join(dir, serveLog))
	if err != nil {
		return fmt.Errorf("creating the cluster log: %w", err)
	}
	defer logFile.Close()
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the ebb binary: %w", err)
	}
	serve := exec.Command(self, "cluster", "serve", "--name", o.Name, "--state-dir", o.StateRoot,
		"--nodes", strconv.Itoa(nodes), "--bin-dir", binDir, "--install="+install, "--real-kubelets="+strconv.FormatBool(realKubelets))
	serve.Stdout, serve.Stderr = logFile, logFile
	if realKubelets {
		if err := localcluster.NamespaceCommandInHostUserNamespace(serve); err != nil {
			return err
		}
	} else {
		localcluster.NamespaceCommand(serve)
	}
	start := time.Now()
	if err := serve.Start(); err != nil {
		return fmt.Errorf("starting the cluster supervisor: %w", err)
	}
	pid := serve.Process.Pid
	if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		_ = serve.Process.Kill()
		return fmt.Errorf("writing the pid file: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- serve.Wait() }()
	fmt.Fprintf(os.Stderr, "Starting cluster %q with %d nodes (log: %s)\n", o.Name, nodes, filepath.Join(dir, serveLog))
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("cluster %q failed to start (%v); the end of its log:\n%s", o.Name, err, localcluster.LogTail(filepath.Join(dir, serveLog), 20))
		case <-deadline.C:
			_ = syscall.Kill(pid, syscall.SIGTERM)
			return fmt.Errorf("cluster %q was not ready after %s; the end of its log:\n%s", o.Name, timeout, localcluster.LogTail(filepath.Join(dir, serveLog), 20))
		case <-ctx.Done():
			_ = syscall.Kill(pid, syscall.SIGTERM)
			return ctx.Err()
		case <-tick.C:
			if _, err := os.Stat(filepath.Join(dir, readyFile)); err == nil {
				fmt.Printf("Cluster %q is up in %s: %d nodes.\n", o.Name, time.Since(start).Round(100*time.Millisecond), nodes)
				fmt.Printf("  ebb cluster exec --name %s -- kubectl get nodes -o wide\n", o.Name)
				if install != "" {
					fmt.Printf("  ebb cluster exec --name %s -- kubectl get services -A   # type LoadBalancer, loadBalancerClass %s\n", o.Name, lbmodel.ClassL4)
				}
				fmt.Printf("  ebb cluster down --name %s\n", o.Name)
				return nil
			}
		}
	}
}

func newServeCommand(o *Options) *cobra.Command {
	var nodes int
	var realKubelets bool
	var binDir string
	var install string
	cmd := &cobra.Command{
		Use:    "serve",
		Short:  "Run a cluster in the foreground inside its namespace (started by `ebb cluster up`)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			return o.serve(cmd.Context(), nodes, binDir, install, realKubelets)
		},
	}
	cmd.Flags().BoolVar(&realKubelets, "real-kubelets", false, "real nodes: kubelet and containerd")
	cmd.Flags().StringVar(&install, "install", "", "install ebb from this manifest as pods of ebb's image")
	cmd.Flags().IntVar(&nodes, "nodes", 3, "number of simulated nodes")
	cmd.Flags().StringVar(&binDir, "bin-dir", "", "directory of the pinned binaries")
	return cmd
}

// installOnFirstNode installs ebb from the manifest with ebb lb on the
// first node, and routes both VIP pools there from the router and from the
// control-plane host (where `ebb cluster exec` runs commands).
func installOnFirstNode(ctx context.Context, c *localcluster.Cluster, manifest string) error {
	first := c.Nodes[0]
	fmt.Printf("[cluster] installing %s (ebb lb on %s)\n", manifest, first.Name)
	if err := ebbrun.InstallManifest(ctx, c, manifest, ebbrun.ManifestOptions{LBNodes: []string{first.Name}}); err != nil {
		return err
	}
	return ebbrun.RouteVIPsTo(c, first)
}

// serve runs the cluster until SIGTERM or SIGINT. It is the init process of
// the cluster's PID namespace, so when it ends every component ends.
func (o *Options) serve(ctx context.Context, nodes int, binDir string, install string, realKubelets bool) error {
	if !localcluster.InNamespace() {
		return errors.New("`ebb cluster serve` runs only inside the namespace `ebb cluster up` makes")
	}
	if err := localcluster.SetupNamespace(); err != nil {
		return err
	}
	dir := o.dir()
	copts := localcluster.Options{Name: o.Name, Nodes: nodes, Dir: dir, BinDir: binDir, Progress: os.Stdout, RealKubelets: realKubelets}
	if install != "" {
		copts.Images = []string{filepath.Join(filepath.Dir(install), "oci")}
	}
	c, err := localcluster.Start(ctx, copts)
	if err != nil {
		return err
	}
	if install != "" {
		if err := installOnFirstNode(ctx, c, install); err != nil {
			return errors.Join(err, c.Stop())
		}
	}
	if err := os.WriteFile(filepath.Join(dir, binDirFile), []byte(c.BinDir+"\n"), 0o644); err != nil {
		return errors.Join(fmt.Errorf("writing the tools directory: %w", err), c.Stop())
	}
	if err := os.WriteFile(filepath.Join(dir, readyFile), nil, 0o644); err != nil {
		return errors.Join(fmt.Errorf("marking the cluster ready: %w", err), c.Stop())
	}
	<-ctx.Done()
	fmt.Println("[cluster] stopping")
	_ = os.Remove(filepath.Join(dir, readyFile))
	return c.Stop()
}

func newDownCommand(o *Options) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Stop a local cluster and remove everything it made",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			return o.down()
		},
	}
}

func (o *Options) down() error {
	pid, err := o.runningPID()
	if err != nil {
		return err
	}
	if pid != 0 {
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("stopping cluster %q (pid %d): %w", o.Name, pid, err)
		}
		if !waitGone(pid, 60*time.Second) {
			// The supervisor is its PID namespace's init: killing it kills
			// every component with it.
			_ = syscall.Kill(pid, syscall.SIGKILL)
			waitGone(pid, 10*time.Second)
		}
	}
	if err := os.RemoveAll(o.dir()); err != nil {
		return fmt.Errorf("removing the state of cluster %q: %w", o.Name, err)
	}
	if pid == 0 {
		fmt.Printf("Cluster %q was not running; its state is removed.\n", o.Name)
	} else {
		fmt.Printf("Cluster %q is stopped.\n", o.Name)
	}
	return nil
}

func newExecCommand(o *Options) *cobra.Command {
	return &cobra.Command{
		Use:   "exec -- COMMAND [ARGS...]",
		Short: "Run a command inside the cluster's network namespace, with KUBECONFIG set",
		Example: `  ebb cluster exec -- kubectl get nodes
  ebb cluster exec -- curl -s http://10.0.0.1:30080/`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			return o.exec(args)
		},
	}
}

func (o *Options) exec(args []string) error {
	pid, err := o.runningPID()
	if err != nil {
		return err
	}
	if _, statErr := os.Stat(filepath.Join(o.dir(), readyFile)); pid == 0 || statErr != nil {
		return fmt.Errorf("cluster %q is not running: start it with `ebb cluster up --name %s`", o.Name, o.Name)
	}
	binDir, err := os.ReadFile(filepath.Join(o.dir(), binDirFile))
	if err != nil {
		return fmt.Errorf("reading the cluster's tools directory: %w", err)
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return fmt.Errorf("ebb cluster exec needs nsenter (Debian package util-linux): %w", err)
	}
	full := []string{"--target", strconv.Itoa(pid), "--net"}
	// A cluster with real kubelets keeps the host's user namespace, which
	// nsenter cannot enter again.
	if !sameUserNamespace(pid) {
		full = append(full, "--user", "--preserve-credentials")
	}
	full = append(append(full, "--"), args...)
	cmd := exec.Command(nsenter, full...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+filepath.Join(o.dir(), kubeconfig),
		"PATH="+strings.TrimSpace(string(binDir))+string(os.PathListSeparator)+os.Getenv("PATH"))
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return &ExitError{Code: exit.ExitCode()}
		}
		return fmt.Errorf("running %s in cluster %q: %w", args[0], o.Name, err)
	}
	return nil
}

// sameUserNamespace says whether process pid is in this process's user
// namespace.
func sameUserNamespace(pid int) bool {
	self, err1 := os.Readlink("/proc/self/ns/user")
	other, err2 := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "ns", "user"))
	return err1 == nil && err2 == nil && self == other
}

// ExitError carries the exit code of a command run by `ebb cluster exec`,
// so that ebb exits with it.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }
