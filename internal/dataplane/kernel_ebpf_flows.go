package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The flow tables of the eBPF kernel path (bpf/ebb_lb.c): flows, keyed by
// the client's packets' addresses and ports, and its twin, replies, keyed
// by the backend's (the program reads it; deleteFlows deletes from it);
// and the same pair for half-open flows, opening and opening_replies,
// from which the program moves a flow to the first pair at the client's
// acknowledgement.
type (
	bpfTuple struct {
		Saddr, Daddr [4]byte
		Sport, Dport [2]byte
	}
	bpfFlow struct {
		Backend, Source bpfEndpoint
		Seen            uint64 // CLOCK_MONOTONIC, ns
		Flags           uint32
		OutIfindex      uint32
	}
	// bpfReply is a replies entry: the key of the flow whose port it is.
	bpfReply struct {
		Client    bpfTuple
		InIfindex uint32
		Pad       uint32
	}
)

// A flow's flags, as the program sets them.
const (
	bpfFlowFinClient  = 1
	bpfFlowFinBackend = 2
	bpfFlowRST        = 4
	bpfFlowAnswered   = 8
	bpfFlowOpening    = 32 // half-open: the client has not acknowledged the backend's answer
)

// A half-open flow is one the backend never answered, or whose client
// never acknowledged the answer (a SYN flood from addresses that never see
// the answers). Only the client's packets keep it alive.
const (
	// bpfHalfOpenTakeover is the program's HALF_OPEN_NS: a half-open
	// flow whose client has been silent this long gives its source port
	// to a new flow that found none free.
	bpfHalfOpenTakeover = time.Second
	// bpfHalfOpenTimeout is when the sweeper deletes a half-open flow
	// whose client has been silent: longer than the takeover, which only
	// a shortage of ports triggers, so that a client with a long round
	// trip completes its handshake when nothing presses.
	bpfHalfOpenTimeout = 5 * time.Second
)

// bpfSweepInterval is how often the sweeper reads the flow table. It
// ends idle flows (minutes) and unanswered ones; ended flows it leaves
// to the table's LRU and to the program, which takes their source ports
// over, so that a connection costs no system call of ebb's.
const bpfSweepInterval = 10 * time.Second

// over reports whether the flow has ended: reset, or closed both ways.
func (f *bpfFlow) over() bool {
	const closed = bpfFlowFinClient | bpfFlowFinBackend
	return f.Flags&bpfFlowRST != 0 || f.Flags&closed == closed
}

// replyKey is the key of the flow's entry in replies.
func (f *bpfFlow) replyKey() bpfTuple {
	return bpfTuple{Saddr: f.Backend.Addr, Sport: f.Backend.Port, Daddr: f.Source.Addr, Dport: f.Source.Port}
}

// expired reports whether the sweeper should delete a flow that has
// not ended, age after its last packet.
func (f *bpfFlow) expired(age, idle time.Duration) bool {
	switch {
	case f.over():
		return false
	case f.Flags&bpfFlowAnswered == 0, f.Flags&bpfFlowOpening != 0:
		return age > bpfHalfOpenTimeout
	}
	return age > idle
}

func (t bpfTuple) frontendKey() frontendKey {
	return frontendKey{addr: netip.AddrPortFrom(netip.AddrFrom4(t.Daddr), portOf(t.Dport)), protocol: TCP}
}

func (b bpfEndpoint) addrPort() netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4(b.Addr), portOf(b.Port))
}

// bpfFlowTable is a table of flows and its replies entries' twin.
type bpfFlowTable struct{ flows, replies *ebpf.Map }

// flowTables are the half-open flows' table and the established flows',
// in that order: the program moves a flow from the first to the second
// (inserting it there before it deletes it here), so that a pass that
// reads them in this order sees every flow at least once. A table the
// loaded object lacks (an older program's, in tests) is left out. e.use
// is held, and e.coll is set.
func (e *ebpfPath) flowTables() []bpfFlowTable {
	var out []bpfFlowTable
	for _, names := range [][2]string{{"opening", "opening_replies"}, {"flows", "replies"}} {
		flows, replies := e.coll.Maps[names[0]], e.coll.Maps[names[1]]
		if flows != nil && replies != nil {
			out = append(out, bpfFlowTable{flows, replies})
		}
	}
	return out
}

// eachFlow calls fn with every flow in the tables, half-open or not, read
// in batches (a system call per few thousand flows). A flow the program
// moves from the half-open table meanwhile may be seen twice. e.use is
// held, and e.coll is set.
func (e *ebpfPath) eachFlow(fn func(k bpfTuple, f bpfFlow)) error {
	for _, table := range e.flowTables() {
		if err := eachElement(table.flows, fn); err != nil {
			return err
		}
	}
	return nil
}

// eachElement calls fn with every element of the hash map m.
func eachElement[K, V any](m *ebpf.Map, fn func(k K, v V)) error {
	const batch = 4096
	keys, values := make([]K, batch), make([]V, batch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, values, nil)
		for i := range n {
			fn(keys[i], values[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", m.String(), err)
		}
	}
}

// activeFlows counts the flows that have not ended, of the wanted
// frontends and backends.
func (e *ebpfPath) activeFlows(want map[flowKey]flowLabel) (map[flowKey]int64, error) {
	e.use.RLock()
	defer e.use.RUnlock()
	out := map[flowKey]int64{}
	if e.coll == nil {
		return out, nil
	}
	err := e.eachFlow(func(k bpfTuple, f bpfFlow) {
		key := flowKey{frontend: k.frontendKey(), backend: f.Backend.addrPort()}
		if _, wanted := want[key]; wanted && !f.over() {
			out[key]++
		}
	})
	return out, err
}

// dropFlows deletes the flows fe forwards to backend: the next segment of
// one finds no flow and is answered with a reset by the host's stack.
func (e *ebpfPath) dropFlows(fe frontendKey, backend netip.AddrPort) error {
	e.use.RLock()
	defer e.use.RUnlock()
	if e.coll == nil {
		return nil
	}
	return e.deleteFlows(func(k bpfTuple, f bpfFlow) bool {
		return k.frontendKey() == fe && f.Backend.addrPort() == backend
	}, sameConnection)
}

// deleteFlows deletes the flows gone says to, with their replies'
// entries. e.use is held, and e.coll is set. The program goes on while
// the pass reads the table and deletes: a flow is deleted only if same
// says it is still the one the pass read (for the sweeper, no packet
// since; for a drop, the same connection), and its replies entry only
// with it and only if the entry still names it (the program may have
// given the port to another flow, whose replies would otherwise go to the
// host's stack and be reset). A flow kept keeps its entry.
func (e *ebpfPath) deleteFlows(gone func(k bpfTuple, f bpfFlow) bool, same func(then, now bpfFlow) bool) error {
	for _, table := range e.flowTables() {
		if err := deleteFlowsOf(table, gone, same); err != nil {
			return err
		}
	}
	return nil
}

// deleteFlowsOf is deleteFlows over one table.
func deleteFlowsOf(table bpfFlowTable, gone func(k bpfTuple, f bpfFlow) bool, same func(then, now bpfFlow) bool) error {
	type doomed struct {
		key   bpfTuple
		flow  bpfFlow
		reply bpfTuple
	}
	var del []doomed
	if err := eachElement(table.flows, func(k bpfTuple, f bpfFlow) {
		if gone(k, f) {
			del = append(del, doomed{k, f, f.replyKey()})
		}
	}); err != nil {
		return err
	}
	flows, replies := table.flows, table.replies
	for _, d := range del {
		var now bpfFlow
		if found, err := lookup(flows, d.key, &now); err != nil {
			return err
		} else if !found || !same(d.flow, now) {
			// Kept (a packet since, or a new flow of the port), or gone
			// already: its replies entry is the program's to manage.
			continue
		}
		if err := deleteIfThere(flows, d.key); err != nil {
			return err
		}
		var r bpfReply
		if found, err := lookup(replies, d.reply, &r); err != nil {
			return err
		} else if found && r.Client == d.key {
			if err := deleteIfThere(replies, d.reply); err != nil {
				return err
			}
		}
	}
	return nil
}

// sameFlow: the flow is as the pass read it, no packet since (the
// sweeper deletes only what stayed idle).
func sameFlow(then, now bpfFlow) bool { return then == now }

// sameConnection: the flow is the connection the pass read, whatever
// passed since (the drain timeout drops busy connections too); a new
// connection of the same client port has another initial sequence
// number, or another port toward the backend.
func sameConnection(then, now bpfFlow) bool {
	return then.Backend == now.Backend && then.Source == now.Source
}

// lookup reads m's element at key into value, and reports whether there
// was one.
func lookup(m *ebpf.Map, key, value any) (bool, error) {
	err := m.Lookup(key, value)
	switch {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading an element of %s: %w", m.String(), err)
	}
	return true, nil
}

// sweepEvery sweeps the flow table every interval until stop closes.
func (e *ebpfPath) sweepEvery(interval time.Duration, stop <-chan struct{}) {
	t := e.clock.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C():
		}
		if err := e.sweep(); err != nil {
			e.log.Error(err, "Sweeping the eBPF kernel path's flow table")
		}
	}
}

// sweep deletes the flows idle past their frontend's idle timeout and
// those never answered, and the removed frontends none of whose flows is
// left. The pass over the table holds only e.use.
func (e *ebpfPath) sweep() error {
	now, err := monotonicNow()
	if err != nil {
		return err
	}
	live, err := e.sweepFlows(now)
	if err != nil || live == nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.coll == nil {
		return nil
	}
	return e.deleteDrainedFrontends(live)
}

// sweepFlows deletes the expired flows, and returns the frontends that
// have flows that have not ended (nil when nothing is loaded).
func (e *ebpfPath) sweepFlows(now uint64) (map[bpfFrontendKey]bool, error) {
	e.use.RLock()
	defer e.use.RUnlock()
	if e.coll == nil {
		return nil, nil
	}
	var idle map[bpfFrontendKey]time.Duration
	if p := e.idle.Load(); p != nil {
		idle = *p
	}
	live := map[bpfFrontendKey]bool{}
	err := e.deleteFlows(func(k bpfTuple, f bpfFlow) bool {
		fe := bpfFrontendKeyOf(k.frontendKey())
		timeout, ok := idle[fe]
		if !ok {
			timeout = DefaultTCPIdleTimeout
		}
		if f.expired(time.Duration(int64(now)-int64(f.Seen)), timeout) {
			return true
		}
		if !f.over() {
			live[fe] = true
		}
		return false
	}, sameFlow)
	return live, err
}

// deleteDrainedFrontends deletes the removed frontends' entries that
// have no live flow (none can start: they take no new flow). e.mu is
// held, and e.coll is set.
func (e *ebpfPath) deleteDrainedFrontends(live map[bpfFrontendKey]bool) error {
	for k, fe := range e.contents.frontends {
		if fe.ID != 0 || live[k] {
			continue
		}
		if err := deleteIfThere(e.coll.Maps["frontends"], k); err != nil {
			return err
		}
		delete(e.contents.frontends, k)
	}
	return nil
}

// monotonicNow is the clock of the program's bpf_ktime_get_ns.
func monotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("reading the monotonic clock: %w", err)
	}
	return uint64(ts.Nano()), nil
}

// The program's counters (its stats map, one value per CPU).
const bpfStatNoSourcePort uint32 = 0

// sourcePortsExhausted is how many new flows the program dropped because
// no source port toward their backend was free, since its maps were
// pinned (they outlive ebb lb's restarts); ok is false while nothing is
// loaded, or the counter cannot be read.
func (e *ebpfPath) sourcePortsExhausted() (n float64, ok bool) {
	e.use.RLock()
	defer e.use.RUnlock()
	if e.coll == nil {
		return 0, false
	}
	var perCPU []uint64
	if err := e.coll.Maps["stats"].Lookup(bpfStatNoSourcePort, &perCPU); err != nil {
		e.log.Error(err, "Reading the eBPF kernel path's counters")
		return 0, false
	}
	total := uint64(0)
	for _, v := range perCPU {
		total += v
	}
	return float64(total), true
}
