// Command dataplane benchmarks ebb's data plane (`ebb lb`, both engines)
// against HAProxy 2.6 (as configured by default and with its fast options
// on) and a minimal Go proxy in one run: each load balancer pinned to
// core 0 with one thread, the client and three echo backends on core 1.
// With -topology loopback (the default) every part shares this process's
// network namespace; with -topology routed each is a host of its own and
// the load balancer's host routes between them (topology.go), and the
// kernel engine's eBPF path (which serves clients of other hosts only)
// and a minimal eBPF NAT, the floor of a kernel data path, join. Each round
// runs every contender, a different one first, and medians are reported.
// The last line printed is a JSON summary, also written to
// bench/results/dataplane.json (dataplane-routed.json when routed).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ebbdev/ebb/bench/internal/report"
	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/stats"
)

type round struct {
	connRate, connCPU, connCPUSystem               float64 // connections/s, µs CPU per connection
	keepaliveRPS, keepaliveCPU, keepaliveCPUSystem float64
	throughputMBs                                  float64
	p50, p99                                       float64 // added latency over direct, µs
	drainNewConns, drainResets                     float64
	drainCommandUs                                 float64
	errors                                         float64
	syscallsPerConn, syscallsPerReq                float64 // first round only
}

// contender is one load balancer in the comparison; prefix names its keys
// in the JSON summary ("" for ebb).
type contender struct {
	name, prefix string
	start        func(frontend string, profile bool) (*lbProcess, error)
}

func main() {
	ebbBin := flag.String("ebb", "bin/ebb", "the ebb binary")
	d := flag.Duration("duration", 4*time.Second, "length of each measurement")
	rounds := flag.Int("rounds", 3, "rounds per load balancer (medians are reported)")
	out := flag.String("out", defaultOut, "where to write the JSON summary (bench/results/dataplane-routed.json by default with -topology routed)")
	profile := flag.Bool("profile", false, "save CPU profiles of ebb under each load next to the JSON summary")
	pairs := flag.Int("pairs", defaultSystemPairs, "pairs of alternated slices behind each system-wide figure (more resolve a kernel path's few µs better, and take longer)")
	syscalls := flag.Bool("syscalls", true, "count each contender's system calls per connection and per request with strace -c in the first round")
	only := flag.String("only", "", "comma-separated contenders to run (default: all)")
	topo := flag.String("topology", "loopback", "where the parts run: loopback (client, load balancer and backends in this namespace, every packet through lo) or routed (each a host of its own, the load balancer's routing between the client and the backends; needs root)")
	minimal := flag.String("serve-minimal-proxy", "", "internal: run as the minimal Go proxy listening on this address")
	minimalEBPF := flag.String("serve-minimal-ebpf", "", "internal: run as the minimal eBPF NAT, loading this object file")
	frontend := flag.String("frontend", "", "internal: the minimal eBPF NAT's frontend")
	backends := flag.String("backends", "", "internal: the minimal proxy's or NAT's backends")
	flag.Parse()
	if *pairs < 1 {
		fmt.Fprintln(os.Stderr, "bench-dataplane: -pairs must be at least 1")
		os.Exit(2)
	}
	if *minimal != "" {
		fmt.Fprintln(os.Stderr, serveMinimalProxy(*minimal, strings.Split(*backends, ",")))
		os.Exit(1)
	}
	if *minimalEBPF != "" {
		if err := serveMinimalNAT(*minimalEBPF, "eth0", *frontend, strings.Split(*backends, ",")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if _, err := exec.LookPath("strace"); err != nil && *syscalls {
		fmt.Fprintln(os.Stderr, "bench-dataplane: no strace, system calls are not counted")
		*syscalls = false
	}
	if *topo == "routed" && *out == defaultOut {
		*out = "bench/results/dataplane-routed.json"
	}
	if err := run(*topo, *ebbBin, *d, *rounds, *pairs, *out, *profile, *syscalls, *only); err != nil {
		fmt.Fprintln(os.Stderr, "bench-dataplane:", err)
		os.Exit(1)
	}
}

const defaultOut = "bench/results/dataplane.json"

func contenders(t *topology, ebbBin, dir string, addrs []string, only string) []contender {
	all := []contender{
		{name: "ebb", prefix: "", start: func(fe string, profile bool) (*lbProcess, error) {
			return startEbb(t, ebbBin, dir, fe, addrs, profile)
		}},
		// ebb's proxy engine as it was before its event loop: two
		// goroutines per connection over Go's net package.
		{name: "ebb-goroutines", prefix: "goroutines_", start: func(fe string, _ bool) (*lbProcess, error) {
			p, err := startEbb(t, ebbBin, dir, fe, addrs, false, "--proxy-goroutines")
			if p != nil {
				p.name = "ebb-goroutines"
			}
			return p, err
		}},
		{name: "haproxy", prefix: "haproxy_", start: func(fe string, _ bool) (*lbProcess, error) {
			return startHAProxy(t, dir, fe, addrs, false)
		}},
		{name: "haproxy-tuned", prefix: "haproxy_tuned_", start: func(fe string, _ bool) (*lbProcess, error) {
			return startHAProxy(t, dir, fe, addrs, true)
		}},
		{name: "minimal-go", prefix: "minimal_go_", start: func(fe string, _ bool) (*lbProcess, error) {
			return startMinimalGo(t, dir, fe, addrs)
		}},
		// ebb's kernel engine: the process only programs nftables; the
		// kernel forwards (DNAT in the output hook when the client is on
		// this host, in prerouting when it is routed to it).
		{name: "ebb-kernel", prefix: "nft_", start: func(fe string, _ bool) (*lbProcess, error) {
			p, err := startEbb(t, ebbBin, dir, fe, addrs, false, "--engine", "Kernel", "--kernel-table", benchKernelTable)
			if p != nil {
				p.name = "ebb-kernel"
				p.cleanup = func() { removeKernelPath(t.lbNetNS(), dataplane.KernelPathNftables) } // its rules outlive it, by design
				p.tracksHost = true
			}
			return p, err
		}},
	}
	if t.lb != nil {
		// The floor of a kernel data path without conntrack: an eBPF
		// program on the LB host's client-side interface and its own
		// flow table (bench/dataplane/bpf/minimal_nat.c).
		// ebb's kernel engine on its eBPF path: a tc program and a flow
		// table of its own, no conntrack (internal/dataplane/bpf).
		// Clients on the LB host itself are not its to serve, so it
		// runs in the routed topology only.
		all = append(all, contender{name: "ebb-ebpf", prefix: "ebpf_", start: func(fe string, _ bool) (*lbProcess, error) {
			p, err := startEbb(t, ebbBin, dir, fe, addrs, false, "--engine", "Kernel", "--kernel-path", "ebpf", "--kernel-table", benchKernelTable)
			if p != nil {
				p.name = "ebb-ebpf"
				p.cleanup = func() { removeKernelPath(t.lbNetNS(), dataplane.KernelPathEBPF) } // its pins outlive it, by design
			}
			return p, err
		}})
		all = append(all, contender{name: "minimal-ebpf", prefix: "minimal_ebpf_", start: func(fe string, _ bool) (*lbProcess, error) {
			return startMinimalEBPF(t, dir, fe, addrs)
		}})
	}
	var out []contender
	for _, c := range all {
		if only != "" && !slices.Contains(strings.Split(only, ","), c.name) {
			continue
		}
		if (c.name == "minimal-ebpf" || c.name == "ebb-ebpf") && os.Geteuid() != 0 {
			fmt.Fprintf(os.Stderr, "bench-dataplane: not root, leaving out %s (loading BPF programs needs CAP_BPF and CAP_NET_ADMIN)\n", c.name)
			continue
		}
		if c.name == "ebb-kernel" && os.Geteuid() != 0 {
			fmt.Fprintln(os.Stderr, "bench-dataplane: not root, leaving out ebb-kernel (nftables needs CAP_NET_ADMIN)")
			continue
		}
		out = append(out, c)
	}
	return out
}

// benchKernelTable is the nftables table of the kernel engine under test,
// removed when the benchmark ends (ebb lb leaves it in place at exit).
const benchKernelTable = "ebb-bench"

// removeKernelPath removes what the kernel engine under test left on
// path (nftables tables, or eBPF pins) in the namespace netns.
func removeKernelPath(netns int, path dataplane.KernelPath) {
	dp, err := dataplane.New(dataplane.Options{KernelTable: benchKernelTable, KernelPath: path, NetNS: netns})
	if err == nil {
		_ = dp.RemoveKernelTable()
		_ = dp.Close()
	}
}

func run(topo, ebbBin string, d time.Duration, rounds, pairs int, out string, profile, syscalls bool, only string) error {
	t, err := newTopology(topo)
	if err != nil {
		return err
	}
	defer t.close()
	dir, err := os.MkdirTemp("", "ebb-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	defer removeKernelPath(t.lbNetNS(), dataplane.KernelPathNftables)
	var backends []*echoBackend
	var addrs []string
	for range 3 {
		b, err := newEchoBackend(t)
		if err != nil {
			return err
		}
		backends = append(backends, b)
		addrs = append(addrs, b.ln.Addr().String())
	}
	cs := contenders(t, ebbBin, dir, addrs, only)
	results := map[string][]round{}
	var tracked []float64 // what conntrack alone costs a connection, per round
	for r := range rounds {
		if slices.ContainsFunc(cs, func(c contender) bool { return c.name == "ebb-kernel" }) {
			tr, err := measureTracked(t, addrs[0], pairs)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "round %d conntrack on, no load balancer: system %5.1f µs per connection\n", r+1, tr)
			tracked = append(tracked, tr)
		}
		for i := range cs {
			c := cs[(i+r)%len(cs)] // a different one goes first each round
			lb, err := c.start(t.frontend(), profile && r == 0)
			if err != nil {
				return err
			}
			res, err := measure(t, lb, backends, addrs[0], d, pairs, filepath.Dir(out))
			if err == nil && syscalls && r == 0 {
				err = countAll(t, lb, dir, &res)
			}
			lb.stop()
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			printRound(r, c.name, res)
			results[c.name] = append(results[c.name], res)
		}
	}
	proxy, err := applyToEffect(dataplane.Options{Engine: dataplane.EngineProxy})
	if err != nil {
		return err
	}
	var kernel, ebpf adminStateTimes
	if os.Geteuid() == 0 {
		if kernel, err = applyToEffect(dataplane.Options{Engine: dataplane.EngineKernel}); err != nil {
			return fmt.Errorf("kernel engine: %w", err)
		}
	}
	if slices.ContainsFunc(cs, func(c contender) bool { return c.name == "ebb-ebpf" }) {
		// In the LB host's namespace: the path attaches to every
		// interface of its namespace, and this machine's are not the
		// benchmark's to touch.
		if ebpf, err = applyToEffect(dataplane.Options{Engine: dataplane.EngineKernel, KernelPath: dataplane.KernelPathEBPF, NetNS: t.lbNetNS()}); err != nil {
			return fmt.Errorf("kernel engine, eBPF path: %w", err)
		}
	}
	summary := map[string]any{
		"date":                                      time.Now().UTC().Format(time.RFC3339),
		"topology":                                  topo,
		"rounds":                                    rounds,
		"system_pairs":                              pairs,
		"apply_to_effect_us_p99":                    proxy.applyP99,
		"owner_admin_state_us_p99":                  proxy.ownerP99,
		"owner_admin_down_us_p99":                   proxy.ownerDownP99,
		"owner_admin_down_under_resync_us_p99":      proxy.resyncDownP99,
		"nft_apply_to_effect_us_p99":                kernel.applyP99,
		"nft_owner_admin_state_us_p99":              kernel.ownerP99,
		"nft_owner_admin_down_us_p99":               kernel.ownerDownP99,
		"nft_owner_admin_down_spaced_us_p99":        kernel.spacedDownP99,
		"nft_owner_admin_down_under_resync_us_p99":  kernel.resyncDownP99,
		"nft_prepare_us_mean":                       kernel.prepareMean,
		"ebpf_apply_to_effect_us_p99":               ebpf.applyP99,
		"ebpf_owner_admin_down_us_p99":              ebpf.ownerDownP99,
		"ebpf_owner_admin_down_spaced_us_p99":       ebpf.spacedDownP99,
		"ebpf_owner_admin_down_under_resync_us_p99": ebpf.resyncDownP99,
	}
	for _, c := range cs {
		addKeys(summary, c.prefix, medians(results[c.name]))
	}
	if tracked != nil {
		summary["conntrack_cpu_us_per_conn_system"] = stats.Median(tracked)
	}
	if e, h := results["ebb"], results["haproxy"]; e != nil && h != nil {
		addRatios(summary, medians(e), medians(h))
	}
	return report.WriteSummary(out, summary)
}

func printRound(r int, name string, res round) {
	fmt.Fprintf(os.Stderr, "round %d %-13s conn/s %6.0f (CPU %5.1f µs, system %5.1f µs, %4.1f syscalls)  keepalive req/s %6.0f (CPU %4.1f µs, system %4.1f µs, %3.1f syscalls)  MB/s %5.0f  added p50/p99 %5.1f/%6.1f µs  drain: %0.f new conns after, %0.f resets, command %0.f µs\n",
		r+1, name, res.connRate, res.connCPU, res.connCPUSystem, res.syscallsPerConn, res.keepaliveRPS, res.keepaliveCPU, res.keepaliveCPUSystem, res.syscallsPerReq,
		res.throughputMBs, res.p50, res.p99, res.drainNewConns, res.drainResets, res.drainCommandUs)
}

// addKeys writes one contender's figures under its prefix.
func addKeys(summary map[string]any, p string, r round) {
	summary[p+"conn_rate"] = r.connRate
	summary[p+"keepalive_rps"] = r.keepaliveRPS
	summary[p+"throughput_mb_s"] = r.throughputMBs
	summary[p+"cpu_us_per_conn"] = r.connCPU
	summary[p+"cpu_us_per_conn_system"] = r.connCPUSystem
	summary[p+"cpu_us_per_keepalive_req"] = r.keepaliveCPU
	summary[p+"cpu_us_per_keepalive_req_system"] = r.keepaliveCPUSystem
	summary[p+"p50_added_latency_us"] = r.p50
	summary[p+"p99_added_latency_us"] = r.p99
	summary[p+"syscalls_per_conn"] = r.syscallsPerConn
	summary[p+"syscalls_per_keepalive_req"] = r.syscallsPerReq
	summary[p+"errors"] = r.errors
	switch p {
	case "": // ebb's drain keys keep their first names
		summary["drain_new_conns_after_apply"] = r.drainNewConns
		summary["drain_resets"] = r.drainResets
		summary["ebb_reload_command_us"] = r.drainCommandUs
	case "minimal_go_": // no drain
	default:
		summary[p+"drain_new_conns_after"] = r.drainNewConns
		summary[p+"drain_resets"] = r.drainResets
		summary[p+"drain_command_us"] = r.drainCommandUs
	}
}

// addRatios writes ebb's figures as multiples of HAProxy's.
func addRatios(summary map[string]any, e, h round) {
	summary["conn_rate_ratio_vs_haproxy"] = ratio(e.connRate, h.connRate)
	summary["keepalive_rps_ratio_vs_haproxy"] = ratio(e.keepaliveRPS, h.keepaliveRPS)
	summary["throughput_ratio_vs_haproxy"] = ratio(e.throughputMBs, h.throughputMBs)
	summary["cpu_per_conn_ratio_vs_haproxy"] = ratio(e.connCPU, h.connCPU)
	summary["cpu_per_keepalive_req_ratio_vs_haproxy"] = ratio(e.keepaliveCPU, h.keepaliveCPU)
	summary["cpu_per_conn_system_ratio_vs_haproxy"] = ratio(e.connCPUSystem, h.connCPUSystem)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return float64(int(a/b*1000)) / 1000
}

// measure runs every load against one load balancer. direct is a
// backend's address, which the client reaches without a load balancer:
// the contender's system-wide figures are its busy time per operation
// minus the direct load's, and its added latency its round trips' minus
// the direct ones', each in slices alternated with its own
// (pairedSystemCost, addedLatency).
func measure(t *topology, lb *lbProcess, backends []*echoBackend, direct string, d time.Duration, pairs int, profileDir string) (round, error) {
	var r round
	profile := func(name string) func() {
		if lb.pprof == "" {
			return func() {}
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			path := filepath.Join(profileDir, "ebb-"+name+".pprof")
			if err := lb.profileCPU(t, d-time.Second, path); err != nil {
				fmt.Fprintln(os.Stderr, "profiling:", err)
			}
		}()
		return func() { <-done }
	}
	var untrack func(load bool) error // nil: the direct slices need nothing
	if lb.tracksHost {
		var err error
		if untrack, err = untrackDirect(t, direct); err != nil {
			return r, err
		}
		defer func() { _ = untrack(true) }() // removes the table
	}
	pid := lb.cmd.Process.Pid
	wait := profile("conn")
	c := measureCost(pid, func() (int64, int64) { return t.newConnections(lb.frontend, 16, d) })
	wait()
	r.connRate = float64(c.ops) / d.Seconds()
	r.connCPU = perOp(c.process, c.ops)
	r.errors += float64(c.errs)
	var err error
	r.connCPUSystem, err = pairedSystemCost(pairs,
		func() (int64, int64) { return t.newConnections(direct, 16, systemSlice) },
		func() (int64, int64) { return t.newConnections(lb.frontend, 16, systemSlice) }, untrack)
	if err != nil {
		return r, err
	}

	wait = profile("keepalive")
	c = measureCost(pid, func() (int64, int64) { return t.keepAlive(lb.frontend, 16, d) })
	wait()
	r.keepaliveRPS = float64(c.ops) / d.Seconds()
	r.keepaliveCPU = perOp(c.process, c.ops)
	r.errors += float64(c.errs)
	r.keepaliveCPUSystem, err = pairedSystemCost(pairs,
		func() (int64, int64) { return t.keepAlive(direct, 16, systemSlice) },
		func() (int64, int64) { return t.keepAlive(lb.frontend, 16, systemSlice) }, untrack)
	if err != nil {
		return r, err
	}

	n, errs := t.bulk(lb.frontend, 4, d)
	r.throughputMBs = float64(n) / d.Seconds() / 1e6
	r.errors += float64(errs)

	if r.p50, r.p99, err = t.addedLatency(lb.frontend, direct, untrack); err != nil {
		return r, err
	}
	if lb.drain == nil {
		return r, nil
	}
	return r, drain(t, lb, backends, &r)
}

// countAll counts the system calls of a contender per new connection and
// per kept-alive request.
func countAll(t *topology, lb *lbProcess, dir string, r *round) error {
	pid := lb.cmd.Process.Pid
	conn, err := countSyscalls(pid, dir, lb.name+"-conn", func() (int64, int64) { return t.newConnections(lb.frontend, 16, 2*time.Second) })
	if err != nil {
		return err
	}
	req, err := countSyscalls(pid, dir, lb.name+"-req", func() (int64, int64) { return t.keepAlive(lb.frontend, 16, 2*time.Second) })
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%s system calls per connection %s\n%s system calls per kept-alive request %s\n", lb.name, conn, lb.name, req)
	r.syscallsPerConn, r.syscallsPerReq = conn.perOp, req.perOp
	return nil
}

// drain sets backend 0 to drain under a constant stream of new connections
// and 12 long-lived ones, and counts new connections that still reach it
// after the command returned, and failures on the long-lived connections.
func drain(t *topology, lb *lbProcess, backends []*echoBackend, r *round) error {
	var stop atomic.Bool
	var resets atomic.Int64
	var wg sync.WaitGroup
	for range 12 {
		c, err := t.dial(lb.frontend)
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
		t.newConnections(lb.frontend, 4, 2*time.Second)
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
		connCPUSystem: med(func(r round) float64 { return r.connCPUSystem }),
		keepaliveRPS:  med(func(r round) float64 { return r.keepaliveRPS }), keepaliveCPU: med(func(r round) float64 { return r.keepaliveCPU }),
		keepaliveCPUSystem: med(func(r round) float64 { return r.keepaliveCPUSystem }),
		// Counted in the first round only.
		syscallsPerConn: rs[0].syscallsPerConn, syscallsPerReq: rs[0].syscallsPerReq,
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
