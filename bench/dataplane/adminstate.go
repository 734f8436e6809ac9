package main

import (
	"fmt"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/stats"
)

// adminStateTimes are the p99s, in µs, of setting one node's backends Down
// or back in a configuration of 50 frontends of 10 backends (one backend
// per node each). When a call returns, the change is in effect for every
// new connection.
type adminStateTimes struct {
	// applyP99: by a whole-configuration Apply, Down and back alternating.
	applyP99 float64
	// ownerP99 and ownerDownP99: by the node fast path SetOwnerAdminState,
	// Down and back alternating back to back; the Down calls alone.
	ownerP99, ownerDownP99 float64
	// spacedDownP99: the fast path's Down calls when changes are spaced
	// out, so that the kernel engine has prepared its entries for the next
	// change in between (as when nodes are tainted seconds apart).
	spacedDownP99 float64
	// resyncDownP99: the fast path's Down calls while whole-configuration
	// Applies run again and again in another goroutine (resyncs after
	// Service and EndpointSlice changes on a busy cluster).
	resyncDownP99 float64
	// prepareMean: the mean time of the kernel engine's syncs that prepare
	// the entries for the next change, which run after a change, off its
	// path (from ebb_dataplane_kernel_sync_duration_seconds{kind="entries"}).
	prepareMean float64
}

// spacedChanges and changeSpacing: 40 changes 150 ms apart, past the
// kernel engine's preparation delay (100 ms).
const (
	spacedChanges = 40
	changeSpacing = 150 * time.Millisecond
)

// applyToEffect measures adminStateTimes in-process, with a data plane of
// opts (the engine, the kernel path, the namespace).
func applyToEffect(opts dataplane.Options) (adminStateTimes, error) {
	var out adminStateTimes
	reg := prometheus.NewRegistry()
	opts.KernelTable, opts.Registerer = benchKernelTable, reg
	dp, err := dataplane.New(opts)
	if err != nil {
		return out, err
	}
	defer dp.Close()
	if opts.Engine == dataplane.EngineKernel {
		defer func() { _ = dp.RemoveKernelTable() }()
	}
	cfg, err := adminStateConfig()
	if err != nil {
		return out, err
	}
	if err := applyAll(dp, cfg); err != nil {
		return out, err
	}
	// Each loop flips the state every time, so that every call changes
	// something (a call that changes nothing costs nothing in the kernel).
	var times, owner, down, spaced []time.Duration
	for i := range 1000 {
		for f := range cfg.Frontends {
			cfg.Frontends[f].Backends[3].AdminState = alternate(i)
		}
		start := time.Now()
		if err := applyAll(dp, cfg); err != nil {
			return out, err
		}
		times = append(times, time.Since(start))
	}
	for i := range 1000 {
		state := alternate(i + 1)
		start := time.Now()
		if _, err := dp.SetOwnerAdminState("node-4", state); err != nil {
			return out, err
		}
		owner = append(owner, time.Since(start))
		if state == dataplane.AdminDown {
			down = append(down, time.Since(start))
		}
	}
	for i := range spacedChanges {
		time.Sleep(changeSpacing)
		state := alternate(i)
		start := time.Now()
		if _, err := dp.SetOwnerAdminState("node-4", state); err != nil {
			return out, err
		}
		if state == dataplane.AdminDown {
			spaced = append(spaced, time.Since(start))
		}
	}
	resync, err := downUnderResync(dp, cfg)
	if err != nil {
		return out, err
	}
	out.applyP99 = us(stats.Percentile(times, 0.99))
	out.resyncDownP99 = us(stats.Percentile(resync, 0.99))
	out.ownerP99 = us(stats.Percentile(owner, 0.99))
	out.ownerDownP99 = us(stats.Percentile(down, 0.99))
	out.spacedDownP99 = us(stats.Percentile(spaced, 0.99))
	if opts.Engine == dataplane.EngineKernel && opts.KernelPath != dataplane.KernelPathEBPF {
		if out.prepareMean, err = meanSync(reg, "entries"); err != nil {
			return out, err
		}
	}
	return out, nil
}

// resyncChanges and resyncSpacing: 400 changes 7 ms apart, while a
// whole-configuration Apply runs every resyncGap (each then waits that
// long before the next): a busy cluster's Services and EndpointSlices
// keep ebb lb resyncing, and a node's change lands in an Apply about as
// often as Applies take time.
const (
	resyncChanges = 400
	resyncSpacing = 7 * time.Millisecond
	resyncGap     = 3 * time.Millisecond
)

// downUnderResync times the fast path's Down calls while another goroutine
// applies cfg again and again (cfg is left as it is: a resync's
// configuration computed before the node changed).
func downUnderResync(dp *dataplane.DataPlane, cfg dataplane.Config) ([]time.Duration, error) {
	stop := make(chan struct{})
	resyncErr := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				resyncErr <- nil
				return
			default:
			}
			if err := applyAll(dp, cfg); err != nil {
				resyncErr <- err
				return
			}
			time.Sleep(resyncGap)
		}
	}()
	var down []time.Duration
	for i := range resyncChanges {
		time.Sleep(resyncSpacing)
		state := alternate(i)
		start := time.Now()
		if _, err := dp.SetOwnerAdminState("node-4", state); err != nil {
			close(stop)
			return nil, err
		}
		if state == dataplane.AdminDown {
			down = append(down, time.Since(start))
		}
	}
	close(stop)
	return down, <-resyncErr
}

// adminStateConfig is 50 frontends of 10 backends, each on a port of its
// own.
func adminStateConfig() (dataplane.Config, error) {
	var cfg dataplane.Config
	// Every port is held until all 50 are chosen, so that none is handed
	// out twice.
	var held []net.Listener
	defer func() {
		for _, ln := range held {
			ln.Close()
		}
	}()
	for f := range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return cfg, err
		}
		held = append(held, ln)
		port := ln.Addr().(*net.TCPAddr).Port
		fe := dataplane.Frontend{Name: fmt.Sprintf("fe-%d", f), Address: "127.0.0.1", Port: uint16(port)}
		for b := range 10 {
			fe.Backends = append(fe.Backends, dataplane.Backend{Address: fmt.Sprintf("10.0.0.%d", b+1), Port: uint16(30000 + f), Owner: fmt.Sprintf("node-%d", b+1)})
		}
		cfg.Frontends = append(cfg.Frontends, fe)
	}
	return cfg, nil
}

// meanSync is the mean duration, in µs, of the kernel engine's syncs of
// one kind.
func meanSync(reg *prometheus.Registry, kind string) (float64, error) {
	families, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, f := range families {
		if f.GetName() != "ebb_dataplane_kernel_sync_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == kind && m.GetHistogram().GetSampleCount() > 0 {
				h := m.GetHistogram()
				return h.GetSampleSum() / float64(h.GetSampleCount()) * 1e6, nil
			}
		}
	}
	return 0, nil
}

// alternate is Down, None, Down, ...
func alternate(i int) dataplane.AdminState {
	if i%2 == 1 {
		return dataplane.AdminNone
	}
	return dataplane.AdminDown
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
