package dataplane

import (
	"testing"
)

// A data plane that follows one of another engine or kernel path on the
// same host (`ebb lb --engine` or `--kernel-path` changed, or rolled back)
// serves the frontend with its own backends from its first apply: what
// its predecessor left in the kernel takes no new flow from it. The state
// of a kernel path no longer used is gone; that of the path in use is
// taken over. Before, a proxy that followed the kernel engine never saw a
// connection: the table left behind took them all, to the old backends.
func TestEnginesFollowingAnotherTakeOverFromIt(t *testing.T) {
	nft := engineVariant{engine: EngineKernel}
	ebpf := engineVariant{engine: EngineKernel, path: KernelPathEBPF}
	proxy := engineVariant{engine: EngineProxy}
	for _, tc := range []struct{ from, to engineVariant }{
		{nft, proxy}, {ebpf, proxy}, {nft, ebpf}, {ebpf, nft}, {proxy, ebpf},
	} {
		t.Run(tc.from.String()+"-to-"+tc.to.String(), func(t *testing.T) {
			n := newEngineNetOn(t, tc.from, "IPv4")
			old, oldServer := n.echo(t, 8080)
			n.apply(t, n.frontendOn(80, old))
			if err := n.roundTripNew(t, 80); err != nil {
				t.Fatalf("through %s: %v", tc.from, err)
			}
			if err := n.d.Close(); err != nil {
				t.Fatal(err)
			}

			opts := n.options()
			opts.Engine, opts.KernelPath = tc.to.engine, tc.to.path
			if tc.to.path == KernelPathEBPF {
				t.Cleanup(func() { _ = newEBPFPath(opts).remove() })
			}
			n.d = newDataPlane(t, opts)
			n.engine, n.path = tc.to.engine, tc.to.path
			fresh, freshServer := n.echo(t, 9090)
			n.apply(t, n.frontendOn(80, fresh))
			before := oldServer.accepted.Load()
			for i := range 4 {
				if err := n.roundTripNew(t, 80); err != nil {
					t.Fatalf("connection %d through %s after %s: %v", i, tc.to, tc.from, err)
				}
			}
			if got := oldServer.accepted.Load() - before; got != 0 || freshServer.accepted.Load() != 4 {
				t.Errorf("after the switch the old backend took %d connections and the new one %d; want 0 and 4", got, freshServer.accepted.Load())
			}
			if tc.from.path != tc.to.path && tc.from.engine == EngineKernel {
				left := newKernelEngine(opts.KernelTable, opts.NetNS, opts.Logger).hasState
				if tc.from.path == KernelPathEBPF {
					left = newEBPFPath(opts).hasState
				}
				if found, err := left(); err != nil || found {
					t.Errorf("%s's state still there after the switch to %s: %v, %v", tc.from, tc.to, found, err)
				}
			}
		})
	}
}
