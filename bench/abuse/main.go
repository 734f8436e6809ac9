// Command bench-abuse measures what hostile input costs a standalone ebb
// lb (issue 43). Three hosts (network namespaces) joined by veth pairs:
//
//	client 10.78.1.2 ── 10.78.1.1 lb 10.78.2.1 ── 10.78.2.2 backend
//
// ebb lb runs on the lb host from a configuration file, with a TCP
// frontend (port 80) and a UDP frontend (port 53) on 10.78.9.1, which its
// local routes make the host's own and its guard keeps to those ports.
// Legitimate clients open a new TCP connection each, as fast as 8 workers
// can; it measures their rate unloaded, then while one source cycles UDP
// source ports at -rate datagrams a second for -duration (each a new flow
// to the proxy), sampling ebb lb's resident memory; then the time ebb lb
// takes to write its guard table again after `nft flush ruleset` (a
// firewall reload). Before that, the client sends forged L2 heartbeats
// for 5 s on the segment where ebb lb announces the address by L2
// (unsigned, and with a MAC of random bytes), counting what ebb lb
// refused and accepted and whether it still owns the address. Last, a
// SYN flood (-syn-rate a second for -duration, from two addresses of the
// client's host that drop the answers, so that every connection stays
// half-open) against a third frontend (port 81) that the kernel engine's
// eBPF path serves, while legitimate clients connect to it; their rate is
// compared with theirs unloaded, and with theirs while the same flood
// goes to the backend directly (what the flood costs this machine
// without the eBPF path's part in it). -phases runs some of these only (to
// compare one with an earlier build). It prints a one-line JSON summary
// last and writes it to bench/results/abuse.json.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ebbdev/ebb/bench/internal/report"
	"github.com/ebbdev/ebb/internal/localcluster/network"
)

type options struct {
	ebb, out, pinDir string
	rate, synRate    int
	duration, load   time.Duration
	synDuration      time.Duration
	phases           map[string]bool
}

var (
	clientAddr  = netip.MustParsePrefix("10.78.1.2/24")
	lbFront     = netip.MustParsePrefix("10.78.1.1/24")
	lbBack      = netip.MustParsePrefix("10.78.2.1/24")
	backendAddr = netip.MustParsePrefix("10.78.2.2/24")
)

func main() {
	var o options
	flag.StringVar(&o.ebb, "ebb", "bin/ebb", "the ebb binary")
	flag.StringVar(&o.out, "out", "bench/results/abuse.json", "where the JSON summary goes")
	flag.IntVar(&o.rate, "rate", 20000, "UDP datagrams a second, each from a new source port")
	flag.DurationVar(&o.duration, "duration", 60*time.Second, "how long the UDP flood lasts")
	flag.DurationVar(&o.load, "load", 10*time.Second, "how long the unloaded rate of legitimate connections is measured")
	flag.IntVar(&o.synRate, "syn-rate", 20000, "TCP SYNs a second of the SYN flood, each from a new source port")
	flag.DurationVar(&o.synDuration, "syn-duration", 30*time.Second, "how long each SYN flood lasts (one at the backend directly, one through the eBPF path)")
	flag.StringVar(&o.pinDir, "bpf-pin-dir", "/sys/fs/bpf/ebb-bench-abuse", "where ebb lb's eBPF path pins its maps (removed at the end)")
	phases := flag.String("phases", "udp,l2,nft,syn", "which phases run, comma-separated: udp (the UDP flood), l2 (forged heartbeats), nft (nft flush ruleset), syn (the SYN flood)")
	flag.Parse()
	o.phases = map[string]bool{}
	for _, p := range strings.Split(*phases, ",") {
		switch p {
		case "udp", "l2", "nft", "syn":
			o.phases[p] = true
		default:
			fmt.Fprintf(os.Stderr, "bench-abuse: -phases: unknown phase %q (udp, l2, nft or syn)\n", p)
			os.Exit(2)
		}
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench-abuse: needs root (network namespaces, nftables, raw sockets)")
		os.Exit(1)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-abuse:", err)
		os.Exit(1)
	}
}

// hosts are the benchmark's three hosts.
type hosts struct{ client, lb, backend *network.Host }

func (h *hosts) close() {
	for _, x := range []*network.Host{h.client, h.lb, h.backend} {
		if x != nil {
			x.Close()
		}
	}
}

func build() (*hosts, error) {
	h := &hosts{}
	var err error
	for _, x := range []struct {
		name string
		to   **network.Host
	}{{"abuse-client", &h.client}, {"abuse-lb", &h.lb}, {"abuse-backend", &h.backend}} {
		if *x.to, err = network.NewHost(x.name); err != nil {
			h.close()
			return nil, err
		}
	}
	any4 := netip.MustParsePrefix("0.0.0.0/0")
	for _, err := range []error{
		network.LinkHosts(h.lb, "eth0", []netip.Prefix{lbFront}, h.client, "eth0", []netip.Prefix{clientAddr}),
		network.LinkHosts(h.lb, "eth1", []netip.Prefix{lbBack}, h.backend, "eth0", []netip.Prefix{backendAddr}),
		h.client.AddRoute(any4, lbFront.Addr()),
		h.backend.AddRoute(any4, lbBack.Addr()),
		h.lb.SetSysctl("net/ipv4/ip_forward", "1"), // the kernel engine's
		h.client.SetSysctl("net/ipv4/tcp_tw_reuse", "1"),
		h.lb.SetSysctl("net/ipv4/tcp_tw_reuse", "1"),
		// Thousands of connections a second leave as many in TIME_WAIT,
		// in the sockets and in conntrack (which the guard's rule turns
		// on): without a bound, each measurement would start with more of
		// them than the one before, and run slower for that alone (10 %
		// between two unloaded measurements).
		h.client.SetSysctl("net/ipv4/tcp_max_tw_buckets", "4096"),
		h.lb.SetSysctl("net/ipv4/tcp_max_tw_buckets", "4096"),
		h.backend.SetSysctl("net/ipv4/tcp_max_tw_buckets", "4096"),
	} {
		if err != nil {
			h.close()
			return nil, err
		}
	}
	return h, nil
}

const config = `frontends:
- {name: web, address: 10.78.9.1, port: 80, backends: [{address: 10.78.2.2, port: 8080}]}
- {name: web-ebpf, address: 10.78.9.1, port: 81, engine: Kernel, backends: [{address: 10.78.2.2, port: 8080}]}
- {name: dns, address: 10.78.9.1, port: 53, protocol: UDP, backends: [{address: 10.78.2.2, port: 5353}]}
`

// forgeFor is how long forged heartbeats are sent.
const forgeFor = 5 * time.Second

func run(o options) error {
	h, err := build()
	if err != nil {
		return fmt.Errorf("building the hosts: %w", err)
	}
	defer h.close()
	stopBackends, err := serveBackends(h.backend)
	if err != nil {
		return err
	}
	defer stopBackends()
	dir, err := os.MkdirTemp("", "bench-abuse")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "lb.yaml")
	if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
		return err
	}
	ebb, err := filepath.Abs(o.ebb)
	if err != nil {
		return err
	}
	keys, err := writeKeyDir(dir)
	if err != nil {
		return err
	}
	// L2 on the client's segment, with a key: the forged heartbeats' target.
	cmd := exec.Command(ebb, "lb", "--config", file, "--metrics-bind-address", "127.0.0.1:9464", "--handoff-socket", "",
		"--l2-interface", "eth0", "--l2-key-dir", keys, "--kernel-path", "ebpf", "--bpf-pin-dir", o.pinDir)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := h.lb.Start(cmd); err != nil {
		return fmt.Errorf("starting ebb lb: %w", err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		// The kill leaves its kernel state: the namespace goes with it,
		// and the eBPF path's pins go here.
		_ = os.RemoveAll(o.pinDir)
	}()
	ctx := context.Background()
	for _, addr := range []string{proxyFrontend, ebpfFrontend} {
		if err := waitServing(ctx, h.client, addr); err != nil {
			return err
		}
	}
	summary := map[string]any{"rate": o.rate, "syn_rate": o.synRate, "duration_s": o.duration.Seconds(), "ebb": o.ebb}
	if o.phases["udp"] {
		if err := runUDPFlood(ctx, o, h, cmd.Process.Pid, summary); err != nil {
			return err
		}
	}
	if o.phases["l2"] {
		if err := runForgery(h, cmd.Process.Pid, summary); err != nil {
			return err
		}
	}
	if o.phases["nft"] {
		runFlushRepair(h, summary)
	}
	if o.phases["syn"] {
		if err := runSYNFlood(ctx, o, h, summary); err != nil {
			return err
		}
	}
	return report.WriteSummary(o.out, summary)
}

// runUDPFlood measures the legitimate rate to the proxy unloaded and in
// the UDP flood, and ebb lb's memory and CPU.
func runUDPFlood(ctx context.Context, o options, h *hosts, pid int, summary map[string]any) error {
	fmt.Fprintf(os.Stderr, "bench-abuse: legitimate TCP connections, unloaded, %s\n", o.load)
	cpu := cpuSeconds(pid)
	unloaded := legitRate(ctx, h.client, proxyFrontend, o.load)
	unloadedCPU := (cpuSeconds(pid) - cpu) / o.load.Seconds()
	rssBefore := rssMiB(pid)
	fmt.Fprintf(os.Stderr, "bench-abuse: %.0f connections/s unloaded, ebb lb %.1f MiB; UDP flood at %d/s for %s\n", unloaded, rssBefore, o.rate, o.duration)
	flood, err := udpFlood(ctx, h, pid, o.rate, o.duration)
	if err != nil {
		return err
	}
	summary["legit_conn_rate_unloaded"] = round(unloaded)
	summary["udp_flood_legit_conn_rate"] = round(flood.legitRate)
	summary["udp_flood_legit_conn_rate_ratio"] = round3(flood.legitRate / unloaded)
	// ebb lb's CPU per legitimate connection, unloaded and in the flood:
	// what the flood costs ebb lb itself, apart from the CPU the flood's
	// sender and the kernel take from everyone on this machine.
	summary["lb_cpu_us_per_conn_unloaded"] = round(unloadedCPU / unloaded * 1e6)
	summary["udp_flood_lb_cpu_us_per_conn"] = round(flood.cpu / flood.legitRate * 1e6)
	summary["udp_flood_lb_cpu_cores"] = round3(flood.cpu)
	summary["lb_cpu_cores_unloaded"] = round3(unloadedCPU)
	summary["rss_mib_before"] = round(rssBefore)
	summary["udp_flood_rss_mib"] = round(flood.maxRSS)
	summary["udp_flood_datagrams_sent"] = flood.sent
	metrics := lbMetrics(h.lb)
	summary["udp_flows_at_end"] = metricSum(metrics, "ebb_dataplane_udp_flows")
	summary["udp_flood_refused"] = metricSum(metrics, `ebb_dataplane_refused_total{frontend="dns"`)
	return nil
}

// runForgery sends forged L2 heartbeats and counts what ebb lb did with
// them.
func runForgery(h *hosts, pid int, summary map[string]any) error {
	fmt.Fprintf(os.Stderr, "bench-abuse: forged L2 heartbeats from the client for %s\n", forgeFor)
	forged, err := forgeHeartbeats(h, pid, forgeFor)
	if err != nil {
		return err
	}
	summary["forged_heartbeats_sent"] = forged.sent
	summary["forged_heartbeats_refused"] = forged.refused
	summary["forged_heartbeats_accepted"] = forged.accepted
	summary["forged_heartbeats_lb_cpu_cores"] = round3(forged.lbCPUCores)
	summary["lb_cpu_cores_idle"] = round3(forged.idleCPUCores)
	summary["l2_owned_after_forgery"] = forged.owned
	summary["l2_peers_after_forgery"] = forged.peers
	return nil
}

// runFlushRepair times ebb lb's repair of its guard table after nft
// flush ruleset.
func runFlushRepair(h *hosts, summary map[string]any) {
	// An ebb lb that does not repair (an earlier build, for comparison)
	// gets null and the reason.
	if repair, err := flushRepair(h.lb, 30*time.Second); err != nil {
		summary["nft_flush_repair_s"] = nil
		summary["nft_flush_repair_error"] = err.Error()
	} else {
		summary["nft_flush_repair_s"] = round3(repair.Seconds())
	}
}

// runSYNFlood measures the legitimate rate to the eBPF path's frontend
// unloaded, in a SYN flood whose answers are dropped sent to the backend
// directly (routed through the LB host's stack: the flood's cost to this
// machine and to the backend, without the eBPF path's part), and in the
// same flood through the eBPF path's frontend.
func runSYNFlood(ctx context.Context, o options, h *hosts, summary map[string]any) error {
	if err := addSYNFloodSources(h); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench-abuse: legitimate TCP connections through the eBPF path, unloaded, %s\n", o.load)
	unloaded := legitRate(ctx, h.client, ebpfFrontend, o.load)
	summary["legit_conn_rate_unloaded_ebpf"] = round(unloaded)
	fmt.Fprintf(os.Stderr, "bench-abuse: %.0f connections/s unloaded; SYN flood at %d/s for %s to the backend directly\n", unloaded, o.synRate, o.synDuration)
	direct, err := synFlood(ctx, h, netip.AddrPortFrom(backendAddr.Addr(), 8080), o.synRate, o.synDuration)
	if err != nil {
		return err
	}
	summary["syn_flood_direct_legit_conn_rate"] = round(direct.legitRate)
	summary["syn_flood_direct_legit_conn_rate_ratio"] = round3(direct.legitRate / unloaded)
	fmt.Fprintf(os.Stderr, "bench-abuse: %.0f connections/s; SYN flood at %d/s for %s through the eBPF path\n", direct.legitRate, o.synRate, o.synDuration)
	exhaustedBefore := metricSum(lbMetrics(h.lb), "ebb_dataplane_bpf_source_ports_exhausted_total")
	flood, err := synFlood(ctx, h, netip.MustParseAddrPort(ebpfFrontend), o.synRate, o.synDuration)
	if err != nil {
		return err
	}
	summary["syn_flood_legit_conn_rate"] = round(flood.legitRate)
	summary["syn_flood_legit_conn_rate_ratio"] = round3(flood.legitRate / unloaded)
	summary["syn_flood_syns_sent"] = flood.sent
	summary["syn_flood_source_ports_exhausted"] = metricSum(lbMetrics(h.lb), "ebb_dataplane_bpf_source_ports_exhausted_total") - exhaustedBefore
	return nil
}

// flushRepair flushes the lb host's nftables ruleset and times ebb lb's
// writing its guard table again.
func flushRepair(lb *network.Host, within time.Duration) (time.Duration, error) {
	nft := func(args ...string) error { return lb.Do(func() error { return exec.Command("nft", args...).Run() }) }
	if err := nft("list", "table", "inet", "ebb-guard"); err != nil {
		return 0, fmt.Errorf("ebb lb installed no guard table (nft list table inet ebb-guard): %w", err)
	}
	start := time.Now()
	if err := nft("flush", "ruleset"); err != nil {
		return 0, fmt.Errorf("nft flush ruleset: %w", err)
	}
	for time.Since(start) < within {
		if nft("list", "table", "inet", "ebb-guard") == nil {
			return time.Since(start), nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, fmt.Errorf("the guard table was not written again within %s of nft flush ruleset", within)
}

func metricSum(page, prefix string) float64 {
	total := 0.0
	for _, l := range strings.Split(page, "\n") {
		if !strings.HasPrefix(l, prefix) || strings.HasPrefix(l, "#") {
			continue
		}
		if i := strings.LastIndex(l, " "); i > 0 {
			var v float64
			if _, err := fmt.Sscan(l[i+1:], &v); err == nil {
				total += v
			}
		}
	}
	return total
}

func round(v float64) float64  { return float64(int64(v*10+0.5)) / 10 }
func round3(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }
