package localcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// process is one control-plane component started by the cluster. It is
// stopped by its PID, and killed by the kernel if the cluster's process dies
// first (Pdeathsig), so a crashed test leaves nothing behind.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error // set before done is closed
}

// startProcess starts path with args, its output going to logDir/name.log.
func startProcess(name, path string, args []string, logDir string) (*process, error) {
	return startProcessOn(nil, name, path, args, logDir)
}

// startProcessOn is startProcess on a host of the cluster's network (nil:
// this process's own).
func startProcessOn(host *network.Host, name, path string, args []string, logDir string) (*process, error) {
	return startCommandOn(host, name, exec.Command(path, args...), logDir)
}

// startCommandOn is startProcessOn for a command the caller prepared
// (its environment, say).
func startCommandOn(host *network.Host, name string, cmd *exec.Cmd, logDir string) (*process, error) {
	path := cmd.Path
	logPath := filepath.Join(logDir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644) // a restarted component keeps its earlier log
	if err != nil {
		return nil, fmt.Errorf("opening log for %s: %w", name, err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	start := cmd.Start
	if host != nil {
		start = func() error { return host.Start(cmd) }
	}
	if err := start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, path, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// pid is the process ID.
func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, fmt.Errorf("%s exited: %v (log: %s)", p.name, p.err, p.logPath)
	default:
		return false, nil
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs the process group.
func (p *process) stop(grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stopping %s (pid %d): %w", p.name, p.pid(), err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	// The negative PID is the whole process group, in case it forked.
	if err := syscall.Kill(-p.pid(), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("killing %s (pid %d): %w", p.name, p.pid(), err)
	}
	<-p.done
	return nil
}
