package dataplane

import (
	"fmt"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster/network"
	"github.com/ebbdev/ebb/internal/stats"
)

// fiftyByTen is 50 frontends (frontend(f) for each) of 10 backends, one
// per node (node-1 to node-10): the configuration of the admin-state
// benchmarks.
func fiftyByTen(frontend func(f int) Frontend) Config {
	var cfg Config
	for f := range 50 {
		fe := frontend(f)
		for i := range 10 {
			fe.Backends = append(fe.Backends, Backend{Address: fmt.Sprintf("10.0.0.%d", i+1), Port: uint16(30000 + f), Owner: fmt.Sprintf("node-%d", i+1)})
		}
		cfg.Frontends = append(cfg.Frontends, fe)
	}
	return cfg
}

// kernelPlane is a kernel-engine data plane on path in a network
// namespace of its own, named name; the eBPF path's pins go with the test.
func kernelPlane(tb testing.TB, name string, path KernelPath) *DataPlane {
	tb.Helper()
	host, err := network.NewHost(name)
	if err != nil {
		tb.Fatalf("making a network namespace: %v", err)
	}
	tb.Cleanup(host.Close)
	opts := Options{Engine: EngineKernel, KernelPath: path, NetNS: host.NetNS()}
	if path == KernelPathEBPF {
		tb.Cleanup(func() { _ = newEBPFPath(opts).remove() })
	}
	d, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = d.Close() })
	return d
}

// kernelBenchPlane is kernelPlane serving fiftyByTen.
func kernelBenchPlane(b *testing.B, path KernelPath) (*DataPlane, Config) {
	d := kernelPlane(b, "bench", path)
	cfg := fiftyByTen(func(f int) Frontend {
		return Frontend{Name: fmt.Sprintf("fe-%d", f), Address: "10.9.0.1", Port: uint16(1000 + f)}
	})
	if err := applyAll(d, cfg); err != nil {
		b.Fatal(err)
	}
	return d, cfg
}

// alternate is Down, None, Down, ...
func alternate(i int) AdminState {
	if i%2 == 1 {
		return AdminNone
	}
	return AdminDown
}

// BenchmarkKernelAdminState sets one node Down and back in a kernel-engine
// configuration of 50 frontends of 10 backends (one backend per node
// each): the cost of a leaving node in the kernel engine, through the node
// fast path and through a whole configuration.
func BenchmarkKernelAdminState(b *testing.B) {
	forEachKernelPath(b, benchKernelAdminState)
}

// forEachKernelPath runs bench against each path of the kernel engine.
func forEachKernelPath(b *testing.B, bench func(b *testing.B, path KernelPath)) {
	for _, path := range []KernelPath{KernelPathNftables, KernelPathEBPF} {
		b.Run(string(path), func(b *testing.B) { bench(b, path) })
	}
}

func benchKernelAdminState(b *testing.B, path KernelPath) {
	d, cfg := kernelBenchPlane(b, path)
	b.Run("SetOwnerAdminState", func(b *testing.B) {
		b.ReportAllocs()
		var took []time.Duration
		for i := 0; b.Loop(); i++ {
			start := time.Now()
			if _, err := d.SetOwnerAdminState("node-4", alternate(i)); err != nil {
				b.Fatal(err)
			}
			took = append(took, time.Since(start))
		}
		b.ReportMetric(float64(stats.Percentile(took, 0.99).Microseconds()), "p99-µs")
		if _, err := d.SetOwnerAdminState("node-4", AdminNone); err != nil {
			b.Fatal(err)
		}
	})
	b.Run("Apply", func(b *testing.B) { benchApplyAdminState(b, d, cfg) })
}

// benchApplyAdminState sets node-4's backend of every frontend of cfg Down
// and back by whole configurations.
func benchApplyAdminState(b *testing.B, d *DataPlane, cfg Config) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for f := range cfg.Frontends {
			cfg.Frontends[f].Backends[3].AdminState = alternate(i)
		}
		if err := applyAll(d, cfg); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKernelPrepare is the sync that prepares the entries after a
// node's change (run off the change's path).
func BenchmarkKernelPrepare(b *testing.B) {
	forEachKernelPath(b, benchKernelPrepare)
}

func benchKernelPrepare(b *testing.B, path KernelPath) {
	d, _ := kernelBenchPlane(b, path)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		if _, err := d.SetOwnerAdminState("node-4", alternate(i)); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		d.mu.Lock()
		skipped := d.syncKernelLocked(true)
		d.mu.Unlock()
		if len(skipped) > 0 {
			b.Fatal(skipped[0].Err)
		}
	}
}
