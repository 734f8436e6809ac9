package dataplane

import (
	"os/exec"
	"strings"
	"testing"
)

// A firewall reload that flushes the ruleset, or the kernel engine's
// services chain flushed by hand, takes every kernel frontend's new flows
// away; RepairKernel installs the tables again. Intact tables are left
// alone, and a data plane without kernel frontends has nothing to repair.
func TestRepairKernelReinstallsFlushedTables(t *testing.T) {
	n := newEngineNet(t, EngineKernel, "IPv4")
	if repaired, err := n.d.RepairKernel(); err != nil || repaired {
		t.Fatalf("RepairKernel() with no kernel frontend = %v, %v; want false, nil", repaired, err)
	}
	a, _ := n.echo(t, 8080)
	n.apply(t, n.frontendOn(80, a))
	for _, args := range [][]string{
		{"flush", "ruleset"},
		{"flush", "chain", "ip", DefaultKernelTable, "services"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			if err := n.roundTripNew(t, 80); err != nil {
				t.Fatalf("a new connection before: %v", err)
			}
			if repaired, err := n.d.RepairKernel(); err != nil || repaired {
				t.Fatalf("RepairKernel() of intact tables = %v, %v; want false, nil", repaired, err)
			}
			if err := n.lb.Do(func() error { return exec.Command("nft", args...).Run() }); err != nil {
				t.Fatal(err)
			}
			if _, err := n.dialWithin(t, 80, 300); err == nil {
				t.Fatal("a new connection went through with the tables gone: the test shows nothing")
			}
			if repaired, err := n.d.RepairKernel(); err != nil || !repaired {
				t.Fatalf("RepairKernel() = %v, %v; want true, nil", repaired, err)
			}
			if err := n.roundTripNew(t, 80); err != nil {
				t.Fatalf("a new connection after the repair: %v", err)
			}
		})
	}
}

// KernelStateLeft tells a data plane started after an ebb lb that crashed
// (its kernel path's tables or pins left, still forwarding) from one on a
// clean host, so that its BGP sessions can say the host kept forwarding.
// Each kernel path sees only its own state.
func TestKernelStateLeftSeesWhatAnEarlierDataPlaneLeft(t *testing.T) {
	for _, path := range []KernelPath{KernelPathNftables, KernelPathEBPF} {
		t.Run(string(path), func(t *testing.T) {
			n := newEngineNetOn(t, engineVariant{EngineKernel, path}, "IPv4")
			if n.d.KernelStateLeft() {
				t.Fatal("state left on a host where no data plane ran")
			}
			a, _ := n.echo(t, 8080)
			n.apply(t, n.frontendOn(80, a))
			if err := n.d.Close(); err != nil {
				t.Fatal(err)
			}
			other := KernelPathEBPF
			if path == KernelPathEBPF {
				other = KernelPathNftables
			}
			opts := n.options()
			opts.KernelPath = other
			if newDataPlane(t, opts).KernelStateLeft() {
				t.Errorf("a data plane on the %s path sees the %s path's state as its own", other, path)
			}
			if !newDataPlane(t, n.options()).KernelStateLeft() {
				t.Error("the state the closed data plane left not seen")
			}
		})
	}
}
