package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ebbdev/ebb/internal/stats"
)

// systemBusy is the busy time of all CPUs so far (in /proc/stat, user,
// nice, system, irq and softirq): what a kernel data path costs shows up
// here and not in the load balancer's own process time. Steal is left
// out, with idle and iowait: it is time the hypervisor gave another
// machine while this one wanted to run (up to a quarter of it on the
// machines here), not work done here, and it came and went with the
// neighbours' load.
func systemBusy() time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7} { // user nice system irq softirq
		n, _ := strconv.ParseInt(fields[i], 10, 64)
		busy += n
	}
	const clkTck = 100 // sysconf(_SC_CLK_TCK) on Linux
	return time.Duration(busy) * time.Second / clkTck
}

// processCPU is a process's user plus system CPU time so far.
func processCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// Fields after the command: state is [0]; utime [11], stime [12].
	ut, _ := strconv.ParseInt(fields[11], 10, 64)
	st, _ := strconv.ParseInt(fields[12], 10, 64)
	const clkTck = 100
	return time.Duration(ut+st) * time.Second / clkTck
}

// cost is what one load cost: operations done, the load balancer's own
// CPU time and the busy time of the whole machine.
type cost struct {
	ops, errs      int64
	process, total time.Duration
}

// measureCost runs load and reads both clocks around it; pid 0 measures
// no process (the direct runs).
func measureCost(pid int, load func() (int64, int64)) cost {
	p0, s0 := processCPU(pid), systemBusy()
	ops, errs := load()
	c := cost{ops: ops, errs: errs, total: systemBusy() - s0}
	if pid != 0 {
		c.process = processCPU(pid) - p0
	}
	return c
}

// perOp is d per operation in µs.
func perOp(d time.Duration, ops int64) float64 {
	return us(d) / float64(max(ops, 1))
}

// System-wide figures come from short slices of a load through the
// contender and of the same load straight to a backend, alternated.
const (
	defaultSystemPairs = 6
	systemSlice        = 600 * time.Millisecond
)

// pairedSystemCost is what load adds to the machine's busy time per
// operation over base, in µs: slices of the two alternate (ABBA, pairs of
// them) and the median of the differences within each pair is returned.
// The machine's speed drifts by up to 1.4x within seconds, so one run of
// each, seconds apart, put a kernel path's few µs anywhere from -80 to
// +70 µs; neighbouring slices share most of the drift. prepare, if not
// nil, runs before each slice, outside the measurement, told whether
// load (true) or base (false) comes next, and once more at the end with
// true: what runs next expects the load's state.
func pairedSystemCost(pairs int, base, load func() (int64, int64), prepare func(load bool) error) (float64, error) {
	diffs := make([]float64, 0, pairs)
	for i := range pairs {
		var busy [2]float64 // base, load
		order := []bool{false, true}
		if i%2 == 1 {
			order = []bool{true, false}
		}
		for _, isLoad := range order {
			if prepare != nil {
				if err := prepare(isLoad); err != nil {
					return 0, err
				}
			}
			run := base
			if isLoad {
				run = load
			}
			c := measureCost(0, run)
			if c.ops == 0 {
				return 0, fmt.Errorf("a %v slice completed no operation (%d failed)", systemSlice, c.errs)
			}
			if isLoad {
				busy[1] = perOp(c.total, c.ops)
			} else {
				busy[0] = perOp(c.total, c.ops)
			}
		}
		diffs = append(diffs, busy[1]-busy[0])
	}
	if prepare != nil {
		if err := prepare(true); err != nil {
			return 0, err
		}
	}
	return stats.Median(diffs), nil
}
