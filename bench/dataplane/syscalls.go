package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// syscallCount is what strace -c counted while a load ran.
type syscallCount struct {
	perOp float64        // system calls per operation
	top   map[string]int // calls by name
}

// countSyscalls attaches strace -c to pid, runs load and returns the system
// calls per operation. strace slows the process down, so this runs apart
// from the timed loads; the count per operation does not depend on speed.
func countSyscalls(pid int, dir, name string, load func() (int64, int64)) (syscallCount, error) {
	out := filepath.Join(dir, name+".strace")
	cmd := exec.Command("strace", "-c", "-f", "-q", "-o", out, "-p", strconv.Itoa(pid))
	if err := cmd.Start(); err != nil {
		return syscallCount{}, fmt.Errorf("starting strace: %w", err)
	}
	time.Sleep(300 * time.Millisecond) // attaching to every thread
	ops, _ := load()
	_ = cmd.Process.Signal(syscall.SIGINT)
	_ = cmd.Wait()
	data, err := os.ReadFile(out)
	if err != nil {
		return syscallCount{}, fmt.Errorf("reading strace's summary: %w", err)
	}
	c := syscallCount{top: map[string]int{}}
	total := 0
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || strings.HasPrefix(f[0], "%") || strings.HasPrefix(f[0], "-") {
			continue
		}
		calls, err := strconv.Atoi(f[3]) // % time, seconds, usecs/call, calls
		if err != nil {
			continue
		}
		if f[len(f)-1] == "total" {
			total = calls
		} else {
			c.top[f[len(f)-1]] = calls
		}
	}
	if ops == 0 {
		return c, fmt.Errorf("no operation completed while strace counted %d calls", total)
	}
	c.perOp = float64(total) / float64(ops)
	for k, v := range c.top {
		c.top[k] = int(float64(v)/float64(ops)*10 + 0.5) // tenths per operation
	}
	return c, nil
}

// String lists the calls per operation, most frequent first.
func (c syscallCount) String() string {
	names := make([]string, 0, len(c.top))
	for n, v := range c.top {
		if v > 0 {
			names = append(names, n)
		}
	}
	sort.Slice(names, func(i, j int) bool { return c.top[names[i]] > c.top[names[j]] })
	var b strings.Builder
	fmt.Fprintf(&b, "%.1f:", c.perOp)
	for _, n := range names {
		fmt.Fprintf(&b, " %s %.1f", n, float64(c.top[n])/10)
	}
	return b.String()
}
