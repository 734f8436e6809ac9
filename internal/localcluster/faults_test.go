package localcluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// findProcess finds a process by its executable's name and an argument,
// and captures what restarting it needs.
func TestFindProcess(t *testing.T) {
	tail, err := exec.LookPath("tail")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	marker := filepath.Join(dir, "marker")
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// tail -f runs until killed, with the marker among its arguments.
	// (The earlier sleep 60 MARKER exited at once, as sleep refuses a
	// path for an interval: the test passed only when it read /proc first.)
	cmd := exec.Command(tail, "-f", marker)
	cmd.Env = []string{"EBB_FAULT_TEST=1"}
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	exe, err := filepath.EvalSymlinks(tail)
	if err != nil {
		t.Fatal(err)
	}
	// Until the child has exec'd, /proc shows the test binary's image.
	var p *processImage
	deadline := time.Now().Add(5 * time.Second)
	for {
		if p, err = findProcess(filepath.Base(exe), marker); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if p.pid != cmd.Process.Pid {
		t.Errorf("pid %d, want %d", p.pid, cmd.Process.Pid)
	}
	if want := []string{exe, "-f", marker}; !slices.Equal(p.argv, want) {
		t.Errorf("argv %q, want %q", p.argv, want)
	}
	if !slices.Equal(p.env, []string{"EBB_FAULT_TEST=1"}) {
		t.Errorf("env %q", p.env)
	}
	if p.dir != dir {
		t.Errorf("dir %q, want %q", p.dir, dir)
	}

	if _, err := findProcess(filepath.Base(exe), filepath.Join(dir, "other")); err == nil || !strings.Contains(err.Error(), "0 processes") {
		t.Errorf("a marker no process has: %v", err)
	}
}

func TestSplitNUL(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"a\x00b\x00", []string{"a", "b"}},
		{"a\x00\x00c\x00", []string{"a", "", "c"}},
		{"a", []string{"a"}},
	} {
		if got := splitNUL([]byte(tc.in)); !slices.Equal(got, tc.want) {
			t.Errorf("splitNUL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
