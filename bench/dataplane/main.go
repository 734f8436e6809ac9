// Command dataplane benchmarks ebb's data plane (`ebb lb`) against HAProxy
// 2.6 in one run, on loopback: each load balancer pinned to core 0 with one
// thread, the client and three echo backends on core 1. Rounds alternate
// (ebb, HAProxy, ebb, HAProxy, ...) and medians are reported. The last line
// printed is a JSON summary, also written to bench/results/dataplane.json.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ebbdev/ebb/bench/internal/report"
	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/stats"
)

type round struct {
	connRate, connCPU          float64 // connections/s, µs CPU per connection
	keepaliveRPS, keepaliveCPU float64
	throughputMBs              float64
	p50, p99                   float64 // added latency over direct, µs
	drainNewConns, drainResets float64
	drainCommandUs             float64
	errors                     float64
}

func main() {
	ebbBin := flag.String("ebb", "bin/ebb", "the ebb binary")
	d := flag.Duration("duration", 4*time.Second, "length of each measurement")
	rounds := flag.Int("rounds", 3, "rounds per load balancer (medians are reported)")
	out := flag.String("out", "bench/results/dataplane.json", "where to write the JSON summary")
	profile := flag.Bool("profile", false, "save CPU profiles of ebb under each load next to the JSON summary")
	flag.Parse()
	if err := run(*ebbBin, *d, *rounds, *out, *profile); err != nil {
		fmt.Fprintln(os.Stderr, "bench-dataplane:", err)
		os.Exit(1)
	}
}

func run(ebbBin string, d time.Duration, rounds int, out string, profile bool) error {
	dir, err := os.MkdirTemp("", "ebb-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var backends []*echoBackend
	var addrs []string
	for range 3 {
		b, err := newEchoBackend()
		if err != nil {
			return err
		}
		backends = append(backends, b)
		addrs = append(addrs, b.ln.Addr().String())
	}
	results := map[string][]round{}
	for r := range rounds {
		order := []string{"ebb", "haproxy"}
		if r%2 == 1 {
			order = []string{"haproxy", "ebb"}
		}
		for _, name := range order {
			frontend := freeAddr()
			var lb *lbProcess
			if name == "ebb" {
				lb, err = startEbb(ebbBin, dir, frontend, addrs, profile && r == 0)
			} else {
				lb, err = startHAProxy(dir, frontend, addrs)
			}
			if err != nil {
				return err
			}
			res, err := measure(lb, backends, addrs[0], d, filepath.Dir(out))
			lb.stop()
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			fmt.Fprintf(os.Stderr, "round %d %-7s conn/s %7.0f (%5.1f µs CPU)  keepalive req/s %7.0f (%5.1f µs CPU)  MB/s %6.0f  added p50/p99 %5.1f/%6.1f µs  drain: %0.f new conns after, %0.f resets, command %0.f µs\n",
				r+1, name, res.connRate, res.connCPU, res.keepaliveRPS, res.keepaliveCPU, res.throughputMBs, res.p50, res.p99, res.drainNewConns, res.drainResets, res.drainCommandUs)
			results[name] = append(results[name], res)
		}
	}
	applyP99, ownerP99, err := applyToEffect()
	if err != nil {
		return err
	}
	e, h := medians(results["ebb"]), medians(results["haproxy"])
	summary := map[string]any{
		"date":                             time.Now().UTC().Format(time.RFC3339),
		"rounds":                           rounds,
		"conn_rate":                        e.connRate,
		"haproxy_conn_rate":                h.connRate,
		"conn_rate_ratio_vs_haproxy":       ratio(e.connRate, h.connRate),
		"keepalive_rps":                    e.keepaliveRPS,
		"haproxy_keepalive_rps":            h.keepaliveRPS,
		"keepalive_rps_ratio_vs_haproxy":   ratio(e.keepaliveRPS, h.keepaliveRPS),
		"throughput_mb_s":                  e.throughputMBs,
		"haproxy_throughput_mb_s":          h.throughputMBs,
		"throughput_ratio_vs_haproxy":      ratio(e.throughputMBs, h.throughputMBs),
		"cpu_us_per_conn":                  e.connCPU,
		"haproxy_cpu_us_per_conn":          h.connCPU,
		"cpu_us_per_keepalive_req":         e.keepaliveCPU,
		"haproxy_cpu_us_per_keepalive_req": h.keepaliveCPU,
		"p50_added_latency_us":             e.p50,
		"p99_added_latency_us":             e.p99,
		"haproxy_p50_added_latency_us":     h.p50,
		"haproxy_p99_added_latency_us":     h.p99,
		"drain_new_conns_after_apply":      e.drainNewConns,
		"drain_resets":                     e.drainResets,
		"haproxy_drain_new_conns_after":    h.drainNewConns,
		"haproxy_drain_resets":             h.drainResets,
		"ebb_reload_command_us":            e.drainCommandUs,
		"haproxy_drain_command_us":         h.drainCommandUs,
		"apply_to_effect_us_p99":           applyP99,
		"owner_admin_state_us_p99":         ownerP99,
		"errors":                           e.errors,
		"haproxy_errors":                   h.errors,
	}
	return report.WriteSummary(out, summary)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return float64(int(a/b*1000)) / 1000
}

// measure runs every load against one load balancer.
func measure(lb *lbProcess, backends []*echoBackend, direct string, d time.Duration, profileDir string) (round, error) {
	var r round
	profile := func(name string) func() {
		if lb.pprof == "" {
			return func() {}
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			path := filepath.Join(profileDir, "ebb-"+name+".pprof")
			if err := lb.profileCPU(d-time.Second, path); err != nil {
				fmt.Fprintln(os.Stderr, "profiling:", err)
			}
		}()
		return func() { <-done }
	}
	cpu0 := lb.cpuTime()
	wait := profile("conn")
	n, errs := newConnections(lb.frontend, 16, d)
	wait()
	r.connRate = float64(n) / d.Seconds()
	r.connCPU = us(lb.cpuTime()-cpu0) / float64(max(n, 1))
	r.errors += float64(errs)

	cpu0 = lb.cpuTime()
	wait = profile("keepalive")
	n, errs = keepAlive(lb.frontend, 16, d)
	wait()
	r.keepaliveRPS = float64(n) / d.Seconds()
	r.keepaliveCPU = us(lb.cpuTime()-cpu0) / float64(max(n, 1))
	r.errors += float64(errs)

	n, errs = bulk(lb.frontend, 4, d)
	r.throughputMBs = float64(n) / d.Seconds() / 1e6
	r.errors += float64(errs)

	const samples = 20000
	base, err := latencies(direct, samples)
	if err != nil {
		return r, err
	}
	via, err := latencies(lb.frontend, samples)
	if err != nil {
		return r, err
	}
	r.p50 = us(stats.Percentile(via, 0.50) - stats.Percentile(base, 0.50))
	r.p99 = us(stats.Percentile(via, 0.99) - stats.Percentile(base, 0.99))

	return r, drain(lb, backends, &r)
}

// drain sets backend 0 to drain under a constant stream of new connections
// and 12 long-lived ones, and counts new connections that still reach it
// after the command returned, and failures on the long-lived connections.
func drain(lb *lbProcess, backends []*echoBackend, r *round) error {
	var stop atomic.Bool
	var resets atomic.Int64
	var wg sync.WaitGroup
	for range 12 {
		c, err := net.Dial("tcp", lb.frontend)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			msg, buf := make([]byte, 64), make([]byte, 64)
			for !stop.Load() {
				if exchange(c, msg, buf) != nil {
					resets.Add(1)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		newConnections(lb.frontend, 4, 2*time.Second)
	}()
	time.Sleep(500 * time.Millisecond)
	backends[0].record.Store(true)
	start := time.Now()
	if err := lb.drain(0); err != nil {
		return err
	}
	returned := time.Now()
	r.drainCommandUs = us(returned.Sub(start))
	<-loadDone
	stop.Store(true)
	wg.Wait()
	backends[0].record.Store(false)
	r.drainNewConns = float64(backends[0].acceptsAfter(returned))
	r.drainResets = float64(resets.Load())
	backends[0].mu.Lock()
	backends[0].accepts = nil
	backends[0].mu.Unlock()
	return lb.undrain(0)
}

// applyToEffect measures, in-process, how long it takes to set one node's
// backends Down (or back) in a configuration of 50 frontends of 10 backends
// (one backend per node each): by a whole-configuration Apply, and by the
// node fast path SetOwnerAdminState. When either returns, the change is in
// effect for every new connection. It returns both p99s in µs.
func applyToEffect() (float64, float64, error) {
	dp, err := dataplane.New(dataplane.Options{})
	if err != nil {
		return 0, 0, err
	}
	defer dp.Close()
	var cfg dataplane.Config
	for f := range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, 0, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		fe := dataplane.Frontend{Name: fmt.Sprintf("fe-%d", f), Address: "127.0.0.1", Port: uint16(port)}
		for b := range 10 {
			fe.Backends = append(fe.Backends, dataplane.Backend{Address: fmt.Sprintf("10.0.0.%d", b+1), Port: uint16(30000 + f), Owner: fmt.Sprintf("node-%d", b+1)})
		}
		cfg.Frontends = append(cfg.Frontends, fe)
	}
	if err := applyAll(dp, cfg); err != nil {
		return 0, 0, err
	}
	var times, owner []time.Duration
	for i := range 1000 {
		state := dataplane.AdminDown
		if i%2 == 1 {
			state = dataplane.AdminNone
		}
		for f := range cfg.Frontends {
			cfg.Frontends[f].Backends[3].AdminState = state
		}
		start := time.Now()
		if err := applyAll(dp, cfg); err != nil {
			return 0, 0, err
		}
		times = append(times, time.Since(start))
		start = time.Now()
		if _, err := dp.SetOwnerAdminState("node-4", state); err != nil {
			return 0, 0, err
		}
		owner = append(owner, time.Since(start))
	}
	return us(stats.Percentile(times, 0.99)), us(stats.Percentile(owner, 0.99)), nil
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// medians takes the median of each figure over the rounds.
func medians(rs []round) round {
	med := func(get func(round) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = get(r)
		}
		return stats.Median(v)
	}
	return round{
		connRate: med(func(r round) float64 { return r.connRate }), connCPU: med(func(r round) float64 { return r.connCPU }),
		keepaliveRPS: med(func(r round) float64 { return r.keepaliveRPS }), keepaliveCPU: med(func(r round) float64 { return r.keepaliveCPU }),
		throughputMBs: med(func(r round) float64 { return r.throughputMBs }),
		p50:           med(func(r round) float64 { return r.p50 }), p99: med(func(r round) float64 { return r.p99 }),
		// Drain failures are reported at their worst, not their median.
		drainNewConns: worst(rs, func(r round) float64 { return r.drainNewConns }), drainResets: worst(rs, func(r round) float64 { return r.drainResets }),
		drainCommandUs: med(func(r round) float64 { return r.drainCommandUs }),
		errors:         med(func(r round) float64 { return r.errors }),
	}
}

func worst(rs []round, get func(round) float64) float64 {
	w := 0.0
	for _, r := range rs {
		w = max(w, get(r))
	}
	return w
}

// applyAll applies cfg and fails if any frontend was skipped.
func applyAll(d *dataplane.DataPlane, cfg dataplane.Config) error {
	res, err := d.Apply(cfg)
	if err != nil {
		return err
	}
	return res.Err()
}
