package realnode

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CgroupParent holds every local cluster's node cgroups:
// CgroupParent/<cluster>/<node>.
const CgroupParent = "/ebb"

// Cgroups are the machine's cgroup v1 hierarchies: a node's cgroup exists in
// each (kubelet refuses a cgroupRoot with "missing paths").
type Cgroups struct {
	// Mounts are the hierarchies' mount points.
	Mounts []string
}

// FindCgroups reads the cgroup v1 hierarchies from /proc/self/mountinfo. A
// machine with cgroup v2 alone has none: real nodes are made for v1 here
// (the machines this project runs on), and say so.
func FindCgroups() (Cgroups, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return Cgroups{}, fmt.Errorf("reading the mounts: %w", err)
	}
	defer func() { _ = f.Close() }()
	var c Cgroups
	s := bufio.NewScanner(f)
	for s.Scan() {
		// "36 25 0:31 / /sys/fs/cgroup/memory rw,... shared:13 - cgroup cgroup rw,memory"
		fields := strings.Fields(s.Text())
		for i, field := range fields {
			if field == "-" && i+1 < len(fields) && fields[i+1] == "cgroup" && len(fields) > 4 {
				c.Mounts = append(c.Mounts, fields[4])
			}
		}
	}
	if err := s.Err(); err != nil {
		return Cgroups{}, fmt.Errorf("reading the mounts: %w", err)
	}
	if len(c.Mounts) == 0 {
		return Cgroups{}, errors.New("no cgroup v1 hierarchy is mounted: the local cluster's real nodes run kubelet with cgroup v1 (failCgroupV1: false), and cgroup v2 is not supported yet")
	}
	sort.Strings(c.Mounts)
	return c, nil
}

// Make creates the cgroup path (e.g. /ebb/cluster/node-1) in every
// hierarchy. In cpuset's, each new level gets its parent's cpus and mems:
// a cpuset cgroup without them takes no process.
func (c Cgroups) Make(path string) error {
	for _, m := range c.Mounts {
		dir := m
		for _, part := range strings.Split(strings.Trim(path, "/"), "/") {
			parent := dir
			dir = filepath.Join(dir, part)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("creating the cgroup %s: %w", dir, err)
			}
			// Also for a cgroup that exists: one a crash left half made
			// would refuse every process (ENOSPC) without them.
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if cur, err := os.ReadFile(filepath.Join(dir, f)); err == nil && len(strings.TrimSpace(string(cur))) > 0 {
					continue
				}
				v, err := os.ReadFile(filepath.Join(parent, f))
				if errors.Is(err, fs.ErrNotExist) {
					continue // not the cpuset hierarchy
				}
				if err == nil {
					err = os.WriteFile(filepath.Join(dir, f), v, 0o644)
				}
				if err != nil {
					return fmt.Errorf("setting %s of the cgroup %s: %w", f, dir, err)
				}
			}
		}
	}
	return nil
}

// Join moves the process pid into the cgroup path of every hierarchy; its
// later children start there.
func (c Cgroups) Join(path string, pid int) error {
	for _, m := range c.Mounts {
		procs := filepath.Join(m, path, "cgroup.procs")
		if err := os.WriteFile(procs, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("moving process %d into %s: %w", pid, procs, err)
		}
	}
	return nil
}

// Remove kills every process in the cgroup path and below (a node's
// containers, shims, kubelet and containerd: a power cut), then removes
// the cgroups, deepest first. A path that does not exist is not an error,
// so a crashed run's leftovers can be removed before a new start.
func (c Cgroups) Remove(path string, timeout time.Duration) error {
	if err := checkClusterCgroup(path); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		pids := c.processes(path)
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v of the cgroup %s do not die", pids, path)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var errs []error
	for _, m := range c.Mounts {
		root := filepath.Join(m, path)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		// Deepest first: a cgroup with children cannot be removed.
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := removeCgroup(dirs[i], deadline); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// RemoveStale removes the cgroups of clusters that are gone: trees under
// CgroupParent with no process left, made more than a minute ago (one
// being made now has no process yet). A cluster's processes all die with
// it (it is the init of their PID namespace), so what a crashed cluster
// leaves is empty. Another running cluster's processes are in another PID
// namespace, where cgroup.procs lists them as 0: occupied counts those
// too, so a running cluster's cgroups are never touched.
func (c Cgroups) RemoveStale() error {
	if len(c.Mounts) == 0 {
		return nil
	}
	entries, err := os.ReadDir(filepath.Join(c.Mounts[0], CgroupParent))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing the local clusters' cgroups: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < time.Minute {
			continue
		}
		tree := path.Join(CgroupParent, e.Name())
		if c.occupied(tree) {
			continue
		}
		errs = append(errs, c.Remove(tree, 10*time.Second))
	}
	return errors.Join(errs...)
}

// checkClusterCgroup refuses any path but a cluster's or a node's cgroup
// under CgroupParent (/ebb/CLUSTER[/...]), written plainly: Remove kills
// every process it finds there.
func checkClusterCgroup(p string) error {
	parts := strings.Split(strings.TrimPrefix(p, CgroupParent+"/"), "/")
	if !strings.HasPrefix(p, CgroupParent+"/") || path.Clean(p) != p || parts[0] == "" || parts[0] == "." || parts[0] == ".." {
		return fmt.Errorf("refusing to kill the processes of the cgroup %q: only a local cluster's cgroups, %s/CLUSTER and below, are", p, CgroupParent)
	}
	return nil
}

// removeCgroup removes one empty cgroup; the kernel may still hold it busy
// for a moment after its last process died.
func removeCgroup(dir string, deadline time.Time) error {
	for {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("removing the cgroup %s: %w", dir, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// occupied says whether any process, of any PID namespace, is in path or
// below, in any hierarchy.
func (c Cgroups) occupied(path string) bool {
	visible, others := c.members(path)
	return len(visible) > 0 || others
}

// processes lists the processes in path and below, in every hierarchy,
// that this process's PID namespace can see.
func (c Cgroups) processes(path string) []int {
	visible, _ := c.members(path)
	return visible
}

// members reads every cgroup.procs in path and below, in every hierarchy:
// the processes this PID namespace can see, sorted, and whether there are
// others (cgroup.procs lists a process of another PID namespace as 0).
func (c Cgroups) members(path string) (visible []int, others bool) {
	seen := map[int]bool{}
	for _, m := range c.Mounts {
		_ = filepath.WalkDir(filepath.Join(m, path), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return nil
			}
			for _, f := range strings.Fields(string(data)) {
				pid, err := strconv.Atoi(f)
				switch {
				case err != nil:
				case pid == 0:
					others = true
				case !seen[pid]:
					seen[pid] = true
					visible = append(visible, pid)
				}
			}
			return nil
		})
	}
	sort.Ints(visible)
	return visible, others
}
