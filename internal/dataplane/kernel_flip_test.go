package dataplane

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// Nodes leave and come back in a random order, now and then with the
// entries prepared in between: whichever path a change takes (the owners
// map alone, or a sync), every slot's entry in use is where its flows must
// go, and the owners-map path is taken whenever the entries were prepared
// and nothing else was out.
// On the eBPF path, the maps also hold exactly what the path wrote.
func TestOwnerChangesKeepEveryEntryExact(t *testing.T) {
	for _, path := range []KernelPath{KernelPathNftables, KernelPathEBPF} {
		t.Run(string(path), func(t *testing.T) { ownerChangesKeepEveryEntryExact(t, path) })
	}
}

func ownerChangesKeepEveryEntryExact(t *testing.T, path KernelPath) {
	host, err := network.NewHost("flip")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(host.Close)
	reg := prometheus.NewRegistry()
	opts := Options{Engine: EngineKernel, KernelPath: path, NetNS: host.NetNS(), Registerer: reg}
	if path == KernelPathEBPF {
		t.Cleanup(func() { _ = newEBPFPath(opts).remove() })
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	var cfg Config
	for f := range 6 {
		fe := Frontend{Name: fmt.Sprintf("fe-%d", f), Address: "10.9.0.1", Port: uint16(1000 + f)}
		for i := range 5 {
			// Nodes 1 to 4, node-1 twice (pod mode), weights 1 to 3.
			fe.Backends = append(fe.Backends, Backend{Address: fmt.Sprintf("10.0.%d.%d", f, i+1), Port: 80, Owner: fmt.Sprintf("node-%d", max(1, i)), Weight: 1 + (i+f)%3})
		}
		cfg.Frontends = append(cfg.Frontends, fe)
	}
	if err := applyAll(d, cfg); err != nil {
		t.Fatal(err)
	}
	flips := func() uint64 { return kernelSyncCounts(t, reg)["owners"] }
	rng := rand.New(rand.NewPCG(1, 2))
	down := map[string]bool{}
	fast := 0
	for step := range 200 {
		node := fmt.Sprintf("node-%d", 1+rng.IntN(4))
		state := AdminDown
		if down[node] {
			state = AdminNone
		}
		prepared := rng.IntN(3) == 0
		if prepared {
			d.mu.Lock()
			if skipped := d.syncKernelLocked(true); len(skipped) > 0 {
				t.Fatal(skipped[0].Err)
			}
			d.mu.Unlock()
		}
		othersOut := 0
		for n, isDown := range down {
			if isDown && n != node {
				othersOut++
			}
		}
		before := flips()
		if _, err := d.SetOwnerAdminState(node, state); err != nil {
			t.Fatal(err)
		}
		down[node] = state == AdminDown
		if flips() > before {
			fast++
		} else if prepared && othersOut == 0 {
			t.Errorf("step %d: %s %s with the entries prepared and no other node out took a sync, not the owners map", step, node, state)
		}
		what := fmt.Sprintf("step %d (%s %s)", step, node, state)
		switch k := d.kernel.(type) {
		case *kernelEngine:
			k.mu.Lock()
			for f, w := range k.installed {
				inUse(t, what+", "+f.set.Load().cfg.Name, w.set, &w.plan, k.owners[w.family])
			}
			k.mu.Unlock()
		case *ebpfPath:
			k.mu.Lock()
			for f, w := range k.installed {
				inUse(t, what+", "+f.set.Load().cfg.Name, w.set, &w.plan, k.owners[w.family])
			}
			got, err := readContents(k.coll)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, k.contents) {
				t.Errorf("%s: the eBPF maps hold other entries than the path wrote", what)
			}
			k.mu.Unlock()
		}
		if t.Failed() {
			return
		}
	}
	if fast == 0 {
		t.Error("no change took the owners map alone")
	}
	t.Logf("%d of 200 changes by the owners map alone", fast)
}
