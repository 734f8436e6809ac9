package dataplane

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// Which flows the sweeper deletes: not those that ended (the LRU and the
// program take them over), half-open ones (unanswered, or whose client
// never acknowledged the answer) after 5 s of the client's silence, open
// ones after their frontend's idle timeout.
func TestBPFFlowExpiry(t *testing.T) {
	const idle = 4 * time.Minute
	for _, tc := range []struct {
		name  string
		flags uint32
		age   time.Duration
		want  bool
	}{
		{"answered, recent", bpfFlowAnswered, time.Minute, false},
		{"answered, idle past the timeout", bpfFlowAnswered, idle + time.Second, true},
		{"half closed, idle past the timeout", bpfFlowAnswered | bpfFlowFinClient, idle + time.Second, true},
		{"unanswered, within the SYN retries", 0, 4 * time.Second, false},
		{"unanswered, silent past the half-open timeout", 0, 6 * time.Second, true},
		{"answered, the client's acknowledgement not seen yet", bpfFlowAnswered | bpfFlowOpening, 4 * time.Second, false},
		{"answered, never acknowledged", bpfFlowAnswered | bpfFlowOpening, 6 * time.Second, true},
		{"opened by an earlier program, idle within the timeout", bpfFlowAnswered, 3 * time.Minute, false},
		{"reset, long ago", bpfFlowAnswered | bpfFlowRST, time.Hour, false},
		{"closed both ways, long ago", bpfFlowAnswered | bpfFlowFinClient | bpfFlowFinBackend, time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := bpfFlow{Flags: tc.flags}
			if got := f.expired(tc.age, idle); got != tc.want {
				t.Errorf("expired after %s = %v, want %v", tc.age, got, tc.want)
			}
		})
	}
}

func TestFreeIDsTakeTheLowestUnused(t *testing.T) {
	ids := freeIDs{used: map[uint32]bool{1: true, 3: true}}
	var got []uint32
	for range 3 {
		got = append(got, ids.next())
	}
	if want := []uint32{2, 4, 5}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("next ids %v, want %v", got, want)
	}
	if ids.max() != 5 {
		t.Errorf("max %d, want 5", ids.max())
	}
}

// A restarted eBPF path takes the pinned maps over as they are: the
// first sync of the same configuration keeps every id and writes no
// element, and a node's change right after it is one element of the
// owners map.
func TestEBPFPathRestartKeepsTheMaps(t *testing.T) {
	host, err := network.NewHost("ebpf-restart")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(host.Close)
	opts := Options{Engine: EngineKernel, KernelPath: KernelPathEBPF, NetNS: host.NetNS()}
	t.Cleanup(func() { _ = newEBPFPath(opts).remove() })
	cfg := fiftyByTen(func(f int) Frontend {
		return Frontend{Name: string(rune('a'+f%26)) + string(rune('a'+f/26)), Address: "10.9.0.1", Port: uint16(1000 + f)}
	})
	first, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := applyAll(first, cfg); err != nil {
		t.Fatal(err)
	}
	before := first.kernel.(*ebpfPath).contents
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	second := newDataPlane(t, opts)
	e := second.kernel.(*ebpfPath)
	e.mu.Lock()
	if err := e.load(); err != nil {
		t.Fatal(err)
	}
	e.mu.Unlock()
	if err := applyAll(second, cfg); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	after := e.contents
	got, err := readContents(e.coll)
	e.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	for k, fe := range before.frontends {
		if after.frontends[k] != fe {
			t.Errorf("frontend %v: %+v after the restart, %+v before", k, after.frontends[k], fe)
		}
	}
	for id, name := range before.ownerNames {
		if after.ownerNames[id] != name {
			t.Errorf("owner %d: %q after the restart, %q before", id, after.ownerNames[id], name)
		}
	}
	if !reflect.DeepEqual(got.slots, before.slots) {
		t.Error("the slots the maps hold changed with the restart")
	}
	syncs := kernelSyncCounts(t, reg)
	if syncs["entries"] != 0 || syncs["rebuild"] != 0 {
		t.Errorf("the first sync after the restart rewrote entries: syncs %v", syncs)
	}
	flips := syncs["owners"]
	if _, err := second.SetOwnerAdminState("node-4", AdminDown); err != nil {
		t.Fatal(err)
	}
	if kernelSyncCounts(t, reg)["owners"] != flips+1 {
		t.Error("a node's change after the restart did not take the owners map alone")
	}
}

// A removed frontend's established connections continue on the eBPF path
// (its entry stays, taking no new flow); once they end, the sweeper
// deletes the entry.
func TestEBPFPathRemovedFrontendDrains(t *testing.T) {
	n := newEngineNetOn(t, engineVariant{engine: EngineKernel, path: KernelPathEBPF}, "IPv4")
	c := removedFrontendDrains(t, n)
	e := n.d.kernel.(*ebpfPath)
	entries := func() int {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.contents.frontends)
	}
	if err := e.sweep(); err != nil {
		t.Fatal(err)
	}
	if entries() != 1 {
		t.Fatalf("the removed frontend's entry went while its connection lasts (%d entries)", entries())
	}
	_ = c.Close()
	waitFor(t, "the sweeper to delete the drained frontend", func() bool {
		if err := e.sweep(); err != nil {
			t.Fatal(err)
		}
		return entries() == 0
	})
}

// Owners keep the ids the maps gave them, new ones take the lowest free
// id, and the id of an owner gone in this sync is not handed to a new one
// (its slots' homes still point at it until they are rewritten); the
// states are newOwnerTable's.
func TestEBPFOwnerIDsAreStableAndNotReusedAtOnce(t *testing.T) {
	backendOf := func(owner string, down bool) *backend {
		b := slotBackend(len(owner), 1)
		b.owner = owner
		if down {
			b.admin.Store(int32(adminDown))
		}
		return b
	}
	f := &frontend{}
	f.set.Store(&backendSet{backends: []*backend{backendOf("node-b", false), backendOf("node-new", true)}})
	e := &ebpfPath{contents: newBPFContents(nil)}
	e.contents.ownerNames = map[uint32]string{1: "node-gone", 2: "node-b"}
	owners, err := e.ownerTable([]*frontend{f})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]uint32{"node-b": 2, "node-new": 3}; !reflect.DeepEqual(owners.ids, want) {
		t.Errorf("ids %v, want %v (node-b keeps 2, node-new does not take node-gone's 1)", owners.ids, want)
	}
	if owners.state[2] != ownerUp || owners.state[3] != ownerDown {
		t.Errorf("states %v, want node-b up and node-new down", owners.state)
	}
}

// Auto on the eBPF path gives the kernel an IPv4 TCP frontend and the
// proxy a UDP one, which the path cannot forward, instead of refusing it.
func TestEBPFPathAutoLeavesWhatItCannotForwardToTheProxy(t *testing.T) {
	n := newEngineNetOn(t, engineVariant{engine: EngineAuto, path: KernelPathEBPF}, "IPv4")
	a, _ := n.echo(t, 8080)
	tcp := n.frontendOn(80, a)
	udp := n.frontendOn(53, Backend{Address: n.ip.backend.String(), Port: 5353})
	udp.Protocol = UDP
	n.apply(t, tcp, udp)
	n.expectKernelServesOnly(t, tcp.Name)
	// What a user sees of it: the metric names each frontend's engine.
	want := `
# HELP ebb_dataplane_frontend_engine 1 for each frontend served, by the engine that serves it (Proxy or Kernel) and, for Kernel, its path (nftables or ebpf).
# TYPE ebb_dataplane_frontend_engine gauge
ebb_dataplane_frontend_engine{engine="Kernel",frontend="` + tcp.Name + `",path="ebpf"} 1
ebb_dataplane_frontend_engine{engine="Proxy",frontend="` + udp.Name + `",path=""} 1
`
	if err := testutil.GatherAndCompare(n.reg, strings.NewReader(want), "ebb_dataplane_frontend_engine"); err != nil {
		t.Error(err)
	}
	if err := n.roundTripNew(t, 80); err != nil {
		t.Errorf("through the eBPF path: %v", err)
	}
}
