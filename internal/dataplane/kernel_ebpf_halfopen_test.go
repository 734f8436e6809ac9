package dataplane

import (
	"net/netip"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/synflood"
)

// A SYN flood whose SYN-ACKs never reach the sender (spoofed or dropped
// sources) must not keep the eBPF path's source ports toward a backend:
// the flows it opens are half-open until the client acknowledges the
// backend's answer, and a half-open flow silent for bpfHalfOpenTakeover
// gives its port to the next new flow. The flood here sends a SYN from
// every port of two addresses of the client's host (about 129,000),
// more than the source ports toward one backend; the client's host drops
// the backend's SYN-ACKs to those addresses, so that it never resets
// them. Then: the flows that could not get a port are counted, a
// connection established before the flood still works, and a new
// connection after the half-open timeout is served.
func TestEBPFPathHalfOpenFloodGivesItsSourcePortsBack(t *testing.T) {
	n := newEngineNetOn(t, engineVariant{engine: EngineKernel, path: KernelPathEBPF}, "IPv4")
	// No series before the maps are loaded: they are pinned, and a
	// series from 0 to their total at each restart would look like an
	// increase.
	if families, err := n.reg.Gather(); err != nil {
		t.Fatal(err)
	} else {
		for _, f := range families {
			if f.GetName() == "ebb_dataplane_bpf_source_ports_exhausted_total" {
				t.Errorf("%s exported before the eBPF path loaded its maps", f.GetName())
			}
		}
	}
	be, _ := n.echo(t, 8080)
	n.apply(t, n.frontendOn(80, be))
	before := n.established(t, 80, 1)[0]

	sent := n.synFlood(t, 80, 2)

	got := sumCounters(t, n.reg, "ebb_dataplane_bpf_source_ports_exhausted_total")
	t.Logf("%.0f new flows found no source port", got)
	if got == 0 {
		t.Errorf("no new flow counted as refused for want of a source port after %d SYNs; want some (the flood holds more ports than a backend has)", sent)
	}
	if err := roundTrip(before, []byte("still here")); err != nil {
		t.Errorf("a connection established before the flood: %v", err)
	}
	time.Sleep(bpfHalfOpenTakeover + time.Second)
	c, err := n.dialWithin(t, 80, 3000)
	if err != nil {
		t.Fatalf("a new connection %s after the flood: %v; want it served (the flood's half-open flows give their source ports back)", bpfHalfOpenTakeover+time.Second, err)
	}
	defer c.Close()
	if err := roundTrip(c, []byte("hello")); err != nil {
		t.Errorf("a new connection after the flood: %v", err)
	}
}

// The sweeper (and the drain timeout's drop) reads the flow table, then
// deletes; a packet of a connection that arrives in between keeps the
// flow, and must keep its replies entry too. (Until 2026-11-29 the entry
// went, the backend's segments met the host's stack, and the connection
// hung: found by review.)
func TestDeletingFlowsKeepsTheRepliesOfAFlowThatChangedMeanwhile(t *testing.T) {
	n := newEngineNetOn(t, engineVariant{engine: EngineKernel, path: KernelPathEBPF}, "IPv4")
	be, _ := n.echo(t, 8080)
	n.apply(t, n.frontendOn(80, be))
	c := n.established(t, 80, 1)[0]
	e := n.d.kernel.(*ebpfPath)
	e.use.RLock()
	err := e.deleteFlows(func(bpfTuple, bpfFlow) bool {
		// A segment of the connection arrives after the pass read it.
		if err := roundTrip(c, []byte("meanwhile")); err != nil {
			t.Errorf("a round trip during the pass: %v", err)
		}
		return true
	}, sameFlow)
	e.use.RUnlock()
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if err := roundTrip(c, []byte("after")); err != nil {
		t.Errorf("the connection after the pass: %v, want it served (its flow changed, so the pass kept it)", err)
	}
}

// A SYN flood spread over many backends has more source ports to hold
// than the flow table has entries (33,512 per backend), so the port
// takeover no longer bounds its half-open flows: until 2026-11-29 they
// filled the table, whose LRU then evicted established connections that
// were idle (their segments met the host's stack, which reset them).
// Half-open flows now have a table of their own: a flood evicts only
// other half-open flows. The flood here is 967,680 SYNs (about 70,000 a
// second) over ten backends, nearly four times what the flow table
// holds: with one, 322,560, the LRU happened to spare the idle
// connections; with this one 9 of 20 were reset on the earlier program.
func TestEBPFPathFloodOverManyBackendsKeepsEstablishedConnections(t *testing.T) {
	n := newEngineNetOn(t, engineVariant{engine: EngineKernel, path: KernelPathEBPF}, "IPv4")
	var backends []Backend
	for port := uint16(8080); port < 8090; port++ {
		be, _ := n.echo(t, port)
		backends = append(backends, be)
	}
	n.apply(t, n.frontendOn(80, backends...))
	before := n.established(t, 80, 20)

	sent := n.synFlood(t, 80, 15)
	established, halfOpen := n.flowsHeld(t)
	t.Logf("the flood left %d flows in the established table, %d in the half-open one", established, halfOpen)
	if established != len(before) {
		t.Errorf("%d flows in the established table after the flood, want %d (the connections opened before it: the flood's flows are half-open)", established, len(before))
	}

	broken := 0
	for i, c := range before {
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if err := roundTrip(c, []byte("still here")); err != nil {
			broken++
			t.Logf("established connection %d: %v", i, err)
		}
	}
	if broken > 0 {
		t.Errorf("%d of %d connections established before a flood of %d SYNs over %d backends broke; want none (a flood may evict only half-open flows)", broken, len(before), sent, len(backends))
	}
	c, err := n.dialWithin(t, 80, 3000)
	if err != nil {
		t.Fatalf("a new connection after the flood: %v", err)
	}
	defer c.Close()
	if err := roundTrip(c, []byte("hello")); err != nil {
		t.Errorf("a new connection after the flood: %v", err)
	}
}

// flowsHeld counts the eBPF path's established and half-open flows.
func (n *engineNet) flowsHeld(t *testing.T) (established, halfOpen int) {
	t.Helper()
	e := n.d.kernel.(*ebpfPath)
	e.use.RLock()
	defer e.use.RUnlock()
	for name, count := range map[string]*int{"flows": &established, "opening": &halfOpen} {
		if err := eachElement(e.coll.Maps[name], func(bpfTuple, bpfFlow) { *count++ }); err != nil {
			t.Fatal(err)
		}
	}
	return established, halfOpen
}

// synFlood sends the frontend's port a SYN from every port from 1024 up
// of that many more addresses of the client's host (10.2.0.3 on), which
// drops the backends' answers to them, so that nothing resets the
// half-open connections (as a flood from spoofed sources). It returns how
// many SYNs it sent.
func (n *engineNet) synFlood(t *testing.T, port uint16, addresses int) int {
	t.Helper()
	var flooders []netip.Addr
	for i := range addresses {
		a := netip.AddrFrom4([4]byte{10, 2, 0, byte(3 + i)})
		flooders = append(flooders, a)
		if err := n.client.AddAddress("eth0", netip.PrefixFrom(a, 24)); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.client.Do(func() error { return synflood.DropAnswers("flood", flooders) }); err != nil {
		t.Fatal(err)
	}
	var s *synflood.Sender
	if err := n.client.Do(func() (err error) { s, err = synflood.Open(); return err }); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	frontend := netip.AddrPortFrom(n.ip.frontend, port)
	start := time.Now()
	sent := 0
	for _, a := range flooders {
		for p := 1024; p <= 65535; p++ {
			if err := s.Send(netip.AddrPortFrom(a, uint16(p)), frontend, uint32(p)*2654435761); err != nil {
				t.Fatal(err)
			}
			sent++
		}
	}
	t.Logf("sent %d SYNs in %s", sent, time.Since(start).Round(time.Millisecond))
	return sent
}
