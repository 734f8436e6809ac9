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

// alternateSlices runs pairs of slices, a base and a load one in each pair,
// ABBA (the pairs' orders alternate: neighbouring slices share most of
// the machine's drift). prepare, if not nil, runs before each slice,
// outside it, told whether load (true) or base (false) comes next, and
// once more at the end with true: what runs next expects the load's state.
// slice runs one slice, told its kind and its pair.
func alternateSlices(pairs int, prepare func(load bool) error, slice func(pair int, load bool) error) error {
	for i := range pairs {
		order := []bool{false, true}
		if i%2 == 1 {
			order = []bool{true, false}
		}
		for _, isLoad := range order {
			if prepare != nil {
				if err := prepare(isLoad); err != nil {
					return err
				}
			}
			if err := slice(i, isLoad); err != nil {
				return err
			}
		}
	}
	if prepare != nil {
		return prepare(true)
	}
	return nil
}

// pairedSystemCost is what load adds to the machine's busy time per
// operation over base, in µs: slices of the two alternate (alternateSlices) and
// the median of the differences within each pair is returned. The
// machine's speed drifts by up to 1.4x within seconds, so one run of
// each, seconds apart, put a kernel path's few µs anywhere from -80 to
// +70 µs. prepare is as for alternateSlices.
func pairedSystemCost(pairs int, base, load func() (int64, int64), prepare func(load bool) error) (float64, error) {
	busy := make([][2]float64, pairs) // per pair: base, load
	err := alternateSlices(pairs, prepare, func(pair int, isLoad bool) error {
		run, kind := base, 0
		if isLoad {
			run, kind = load, 1
		}
		c := measureCost(0, run)
		if c.ops == 0 {
			return fmt.Errorf("a %v slice completed no operation (%d failed)", systemSlice, c.errs)
		}
		busy[pair][kind] = perOp(c.total, c.ops)
		return nil
	})
	if err != nil {
		return 0, err
	}
	diffs := make([]float64, 0, pairs)
	for _, b := range busy {
		diffs = append(diffs, b[1]-b[0])
	}
	return stats.Median(diffs), nil
}
