package dataplane

import (
	"os"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// previousEBPFObject is the eBPF path's object as ebb built it before
// half-open flows had tables of their own (commit b4805d8): its pinned
// maps are what an upgrade from it finds.
const previousEBPFObject = "testdata/ebb_lb.b4805d8.o"

// An upgrade from the previous program keeps its connections: the maps it
// pinned are taken over (the half-open tables are new, pinned beside
// them), and the connections it opened go on through the new program;
// new connections open through the half-open tables and move to the
// established one.
func TestEBPFPathUpgradeFromThePreviousProgramKeepsItsConnections(t *testing.T) {
	previous, err := os.ReadFile(previousEBPFObject)
	if err != nil {
		t.Fatal(err)
	}
	current := ebpfObject
	ebpfObject = previous
	t.Cleanup(func() { ebpfObject = current })

	n := newEngineNetOn(t, engineVariant{engine: EngineKernel, path: KernelPathEBPF}, "IPv4")
	be, _ := n.echo(t, 8080)
	fe := n.frontendOn(80, be)
	n.apply(t, fe)
	before := n.established(t, 80, 4)
	e := n.d.kernel.(*ebpfPath)
	e.use.RLock()
	_, opening := e.coll.Maps["opening"]
	e.use.RUnlock()
	if opening {
		t.Fatalf("%s has a map named opening: it is not the previous program", previousEBPFObject)
	}
	if err := n.d.Close(); err != nil {
		t.Fatal(err)
	}

	ebpfObject = current
	opts := n.options()
	opts.Registerer = prometheus.NewRegistry()
	n.d = newDataPlane(t, opts)
	n.apply(t, fe)
	for i, c := range before {
		if err := roundTrip(c, []byte("after the upgrade")); err != nil {
			t.Errorf("connection %d, opened by the previous program: %v", i, err)
		}
	}
	after := n.established(t, 80, 2)
	established, halfOpen := n.flowsHeld(t)
	if want := len(before) + len(after); established != want || halfOpen != 0 {
		t.Errorf("flows after the upgrade: %d established, %d half-open; want %d and 0 (the previous program's connections and the new ones, all established)", established, halfOpen, want)
	}
}
