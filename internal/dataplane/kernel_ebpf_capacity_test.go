package dataplane

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// frontendsOf makes n frontends on distinct ports, each with backends
// backends.
func frontendsOf(n int, backends int) Config {
	var cfg Config
	for f := range n {
		fe := Frontend{Name: fmt.Sprintf("fe-%05d", f), Address: "10.9.0.1", Port: uint16(1000 + f)}
		for b := range backends {
			fe.Backends = append(fe.Backends, Backend{Address: fmt.Sprintf("10.0.%d.%d", b/250, b%250+1), Port: 30000, Owner: fmt.Sprintf("node-%d", b)})
		}
		cfg.Frontends = append(cfg.Frontends, fe)
	}
	return cfg
}

func skippedFor(res ApplyResult, reason SkipReason) []string {
	var out []string
	for _, s := range res.Skipped {
		if s.Reason == reason {
			out = append(out, s.Name)
		}
	}
	slices.Sort(out)
	return out
}

// Issue 50 item 14: one frontend more than the eBPF path's frontends map
// holds (4,096 elements, ids 1 to 4,095) is refused with the reason, and
// the 4,095 others are served. Before, the sync failed as a whole and took
// every kernel frontend out, at every apply.
func TestEBPFPathServesTheFrontendsThatFit(t *testing.T) {
	d := kernelPlane(t, "ebpf-full", KernelPathEBPF)
	cfg := frontendsOf(4096, 1)
	res, err := d.Apply(cfg)
	if err != nil {
		t.Fatal(err)
	}
	full := skippedFor(res, SkipKernelFull)
	if len(res.Skipped) != 1 || len(full) != 1 || full[0] != "fe-04095" {
		t.Fatalf("skipped %v, want only fe-04095 for want of room", res.Err())
	}
	if !strings.Contains(res.Skipped[0].Err.Error(), "frontends map is full (4095 frontends at most") {
		t.Errorf("the reason: %v", res.Skipped[0].Err)
	}
	e := d.kernel.(*ebpfPath)
	e.mu.Lock()
	served := len(e.contents.frontends)
	e.mu.Unlock()
	if served != 4095 {
		t.Errorf("the frontends map holds %d, want 4095", served)
	}
	if n, size := testutil.ToFloat64(d.m.bpfElements.WithLabelValues("frontends")), testutil.ToFloat64(d.m.bpfSize.WithLabelValues("frontends")); n != 4095 || size != 4096 {
		t.Errorf("ebb_dataplane_bpf_map_elements %v of ebb_dataplane_bpf_map_size %v, want 4095 of 4096", n, size)
	}
	// The same configuration again keeps the same frontends served (those
	// installed come first), and the one left out is still told why.
	res, err = d.Apply(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if full := skippedFor(res, SkipKernelFull); len(res.Skipped) != 1 || len(full) != 1 || full[0] != "fe-04095" {
		t.Fatalf("again: skipped %v", res.Err())
	}
}

// With the slot maps nearly full, the frontends that fit are served and
// the next is refused; one removed makes room, at the sync after the one
// that deletes its slots (a sync writes the new before it deletes the
// old, so that every lookup stays consistent).
func TestEBPFPathRefusesWhatTheSlotMapsCannotHold(t *testing.T) {
	d := kernelPlane(t, "ebpf-slots", KernelPathEBPF)
	e := d.kernel.(*ebpfPath)
	// Two backends are 8 slots, 8 homes and 16 backends elements.
	e.capacity = map[string]int{"frontends": 4096, "homes": 20, "backends": 40, "ranges": 100}
	cfg := frontendsOf(3, 2)
	res, err := d.Apply(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if full := skippedFor(res, SkipKernelFull); len(res.Skipped) != 1 || len(full) != 1 || full[0] != "fe-00002" ||
		!strings.Contains(res.Skipped[0].Err.Error(), "slot maps are full: this frontend needs 16 more elements of the backends map and 8 of the homes map than are left") {
		t.Fatalf("skipped %v, want fe-00002 for want of slots", res.Err())
	}
	cfg.Frontends = cfg.Frontends[1:] // fe-00000 goes
	res, err = d.Apply(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if full := skippedFor(res, SkipKernelFull); len(full) != 1 || full[0] != "fe-00002" {
		t.Fatalf("the sync that removes fe-00000: skipped %v, want fe-00002 still (its slots are deleted last)", res.Err())
	}
	if err := applyAll(d, cfg); err != nil {
		t.Fatalf("the next sync: %v, want both served", err)
	}
}
