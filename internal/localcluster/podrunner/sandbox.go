package podrunner

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// envSandbox carries a container's sandbox spec (JSON) to the program
// re-executed to set it up: a container is started as this same program in
// a new mount namespace, which mounts the container's filesystem, drops what
// the container may not have and executes the image's program in its place.
const envSandbox = "EBB_LOCALCLUSTER_SANDBOX"

// sandboxSpec is what a container's process needs set up before it runs.
type sandboxSpec struct {
	// Root is the image's unpacked filesystem; the process is chrooted
	// there.
	Root         string  `json:"root"`
	ReadOnlyRoot bool    `json:"readOnlyRoot"`
	Mounts       []mount `json:"mounts"`
	// Args[0] is the program: a path in Root, or a name looked up on the
	// PATH of Env.
	Args []string `json:"args"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	// Capabilities are the only ones the process keeps (its bounding set).
	Capabilities []uintptr `json:"capabilities"`
	NoNewPrivs   bool      `json:"noNewPrivs"`
	// Hostname is set in the process's own UTS namespace, if not empty
	// (a pod's name, as a kubelet sets it; hostNetwork pods keep the node's).
	Hostname string `json:"hostname,omitempty"`
}

// mount binds Source (a path of the cluster's host) at Target (a path in
// Root).
type mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly"`
}

// init turns this program into a container's sandbox set-up when the
// runner started it as one (as runc's and Docker's reexec do): it must act
// before anything else of the program runs, and never returns.
func init() {
	spec := os.Getenv(envSandbox)
	if spec == "" {
		return
	}
	err := runSandbox(spec)
	fmt.Fprintf(os.Stderr, "container sandbox: %v\n", err)
	os.Exit(127)
}

// runSandbox sets the container up and executes its program; it returns
// only on error.
func runSandbox(specJSON string) error {
	var s sandboxSpec
	if err := json.Unmarshal([]byte(specJSON), &s); err != nil {
		return fmt.Errorf("reading the sandbox spec: %w", err)
	}
	if len(s.Args) == 0 {
		return fmt.Errorf("no program to run")
	}
	// Capabilities and no_new_privs are per thread; exec happens on this one.
	runtime.LockOSThread()
	if s.Hostname != "" {
		if err := unix.Sethostname([]byte(s.Hostname)); err != nil {
			return fmt.Errorf("setting the hostname: %w", err)
		}
	}
	if err := s.mountAll(); err != nil {
		return err
	}
	if err := unix.Chroot(s.Root); err != nil {
		return fmt.Errorf("entering the container's root %s: %w", s.Root, err)
	}
	dir := s.Dir
	if dir == "" {
		dir = "/"
	}
	if err := os.Chdir(dir); err != nil {
		return fmt.Errorf("entering the working directory %s: %w", dir, err)
	}
	program, err := lookPath(s.Args[0], s.Env)
	if err != nil {
		return err
	}
	if err := dropCapabilities(s.Capabilities); err != nil {
		return err
	}
	if s.NoNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("setting no_new_privs: %w", err)
		}
	}
	if err := syscall.Exec(program, s.Args, s.Env); err != nil {
		return fmt.Errorf("executing %s: %w", program, err)
	}
	return nil
}

// mountAll makes the container's view of the filesystem in this process's
// new mount namespace: nothing it mounts is seen outside.
func (s *sandboxSpec) mountAll() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := unix.Mount(s.Root, s.Root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding the container's root %s: %w", s.Root, err)
	}
	if s.ReadOnlyRoot {
		if err := unix.Mount("", s.Root, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("making the container's root read-only: %w", err)
		}
	}
	if err := unix.Mount("proc", filepath.Join(s.Root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	for _, m := range s.Mounts {
		target := filepath.Join(s.Root, filepath.Clean("/"+m.Target))
		if err := unix.Mount(m.Source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("mounting %s at %s: %w", m.Source, m.Target, err)
		}
		if m.ReadOnly {
			if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
				return fmt.Errorf("making %s read-only: %w", m.Target, err)
			}
		}
	}
	return nil
}

// lookPath finds a program in the container's filesystem (already the
// root): a path as is, a name on the container's PATH.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable %q not found in the image's PATH %s: %w", name, path, exec.ErrNotFound)
}

// dropCapabilities leaves only keep in the bounding set. The process runs
// as root (the cluster's user namespace maps no other user), and root's
// capabilities after exec are its bounding set and inheritable set, so the
// inheritable set is emptied too.
func dropCapabilities(keep []uintptr) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if err := unix.Capget(&hdr, &caps[0]); err != nil {
		return fmt.Errorf("reading capabilities: %w", err)
	}
	caps[0].Inheritable, caps[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &caps[0]); err != nil {
		return fmt.Errorf("clearing inheritable capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clearing ambient capabilities: %w", err)
	}
	data, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return fmt.Errorf("reading the last capability: %w", err)
	}
	last, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return fmt.Errorf("reading the last capability: %w", err)
	}
	kept := map[uintptr]bool{}
	for _, c := range keep {
		kept[c] = true
	}
	for c := uintptr(0); c <= uintptr(last); c++ {
		if kept[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			return fmt.Errorf("dropping capability %d: %w", c, err)
		}
	}
	return nil
}
