package dataplane

import (
	"fmt"
	"testing"
	"time"
)

// newConnectionsTo counts which of backends take n new connections
// through at.
func newConnectionsTo(t *testing.T, at string, n int, backends ...*testBackend) []int64 {
	t.Helper()
	before := make([]int64, len(backends))
	for i, b := range backends {
		before[i] = b.accepted.Load()
	}
	for i := range n {
		if err := dialRoundTrip(at); err != nil {
			t.Fatalf("new connection %d: %v", i, err)
		}
	}
	took := make([]int64, len(backends))
	for i, b := range backends {
		took[i] = b.accepted.Load() - before[i]
	}
	return took
}

// A node that starts leaving while an Apply runs (sockets, probes and the
// kernel sync all run under the data plane's lock; here the lock is held
// by the test, as a long Apply would) is Down for new connections at once,
// not after the Apply.
func TestTheNodeFastPathDoesNotWaitForAnApply(t *testing.T) {
	bothProxies(t, func(t *testing.T, proxy Options) {
		d := newDataPlane(t, proxy)
		a, b := newTestBackend(t), newTestBackend(t)
		at := freeAddr(t, "tcp")
		mustApply(t, d, tcpFrontend("fe", at, a.backend(), b.backend()))

		d.mu.Lock() // an Apply that runs
		downWhileLocked(t, d, a.backend().Owner)
		took := newConnectionsTo(t, at.String(), 8, a, b)
		d.mu.Unlock()
		if took[0] != 0 || took[1] != 8 {
			t.Errorf("with a's node Down during an Apply, new connections went %v to a and b, want [0 8]", took)
		}
	})
}

// downWhileLocked sets owner Down by the fast path while the test holds
// d.mu (as an Apply that runs would), and fails, releasing the lock, if
// the call errs or waits for the lock.
func downWhileLocked(t *testing.T, d *DataPlane, owner string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := d.SetOwnerAdminState(owner, AdminDown)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			d.mu.Unlock()
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		d.mu.Unlock()
		t.Fatal("SetOwnerAdminState waited for the Apply that held the data plane's lock")
	}
}

// A configuration computed before a node's change reached the fast path
// (the full sync read its caches first) does not undo the change: the
// owner keeps the state the fast path set until the fast path sets
// another.
func TestAnOlderConfigurationDoesNotUndoTheFastPath(t *testing.T) {
	d := newDataPlane(t, Options{})
	a, b := newTestBackend(t), newTestBackend(t)
	at := freeAddr(t, "tcp")
	stale := tcpFrontend("fe", at, a.backend(), b.backend())
	mustApply(t, d, stale)
	for _, step := range []struct {
		state AdminState
		cfg   Frontend
		want  []int64
	}{
		{AdminDown, stale, []int64{0, 8}},
		// The backends' set changes shape too (a new backend joins).
		{AdminDown, tcpFrontend("fe", at, a.backend(), b.backend(), Backend{Address: "127.0.0.1", Port: 1, Owner: "node-gone", AdminState: AdminDown}), []int64{0, 8}},
		{AdminNone, withOwnerState(stale, a.backend().Owner, AdminDown), []int64{4, 4}},
	} {
		if _, err := d.SetOwnerAdminState(a.backend().Owner, step.state); err != nil {
			t.Fatal(err)
		}
		mustApply(t, d, step.cfg)
		if took := newConnectionsTo(t, at.String(), 8, a, b); fmt.Sprint(took) != fmt.Sprint(step.want) {
			t.Errorf("after the fast path set %s and an older configuration applied: new connections went %v to a and b, want %v", step.state, took, step.want)
		}
	}
}

// Once the fast path's hold on an owner is forgotten, the configuration's
// admin states apply again, from the next Apply on (a blind LB host's own
// node, Down in one frontend and not in another).
func TestAForgottenOwnerTakesTheConfigurationsState(t *testing.T) {
	d := newDataPlane(t, Options{})
	a, b := newTestBackend(t), newTestBackend(t)
	at := freeAddr(t, "tcp")
	fe := tcpFrontend("fe", at, a.backend(), b.backend())
	mustApply(t, d, fe)
	if _, err := d.SetOwnerAdminState(a.backend().Owner, AdminNone); err != nil {
		t.Fatal(err)
	}
	mustApply(t, d, withOwnerState(fe, a.backend().Owner, AdminDown))
	if took := newConnectionsTo(t, at.String(), 8, a, b); fmt.Sprint(took) != "[4 4]" {
		t.Fatalf("held None by the fast path: new connections went %v to a and b, want [4 4]", took)
	}
	d.ForgetOwnerAdminState(a.backend().Owner)
	mustApply(t, d, withOwnerState(fe, a.backend().Owner, AdminDown))
	if took := newConnectionsTo(t, at.String(), 8, a, b); fmt.Sprint(took) != "[0 8]" {
		t.Errorf("forgotten, then Down by the configuration: new connections went %v to a and b, want [0 8]", took)
	}
}

// withOwnerState is fe with owner's backends in state.
func withOwnerState(fe Frontend, owner string, state AdminState) Frontend {
	fe.Backends = append([]Backend(nil), fe.Backends...)
	for i := range fe.Backends {
		if fe.Backends[i].Owner == owner {
			fe.Backends[i].AdminState = state
		}
	}
	return fe
}

// The same on every engine: on the kernel paths, a change whose entries
// were prepared goes into the kernel without the data plane's lock.
func TestEnginesNodeFastPathDoesNotWaitForAnApply(t *testing.T) {
	forEachEngine(t, func(t *testing.T, n *engineNet) {
		a, sa := n.echo(t, 8080)
		b, sb := n.echo(t, 8081)
		n.apply(t, n.frontendOn(80, a, b))
		d := n.d
		d.mu.Lock()
		skipped := d.syncKernelLocked(true) // the entries prepared, as 100 ms after the Apply
		if len(skipped) > 0 {
			d.mu.Unlock()
			t.Fatalf("preparing the kernel's entries: %v", skipped[0].Err)
		}
		// From here the lock is held, as by an Apply that runs.
		downWhileLocked(t, d, a.Owner)
		beforeA, beforeB := sa.accepted.Load(), sb.accepted.Load()
		for i := range 6 {
			if err := n.roundTripNew(t, 80); err != nil {
				d.mu.Unlock()
				t.Fatalf("new connection %d with a's node Down: %v", i, err)
			}
		}
		d.mu.Unlock()
		if took := sa.accepted.Load() - beforeA; took != 0 {
			t.Errorf("a's node Down during an Apply: a took %d of 6 new connections (b %d), want 0", took, sb.accepted.Load()-beforeB)
		}
	})
}

// Once a data plane has handed over to a successor, the kernel's tables
// are the successor's: the fast path of the retired one changes nothing
// in them.
func TestEnginesFastPathOfARetiredDataPlaneLeavesTheKernelAlone(t *testing.T) {
	forEachEngine(t, func(t *testing.T, n *engineNet) {
		if n.engine != EngineKernel {
			return // the proxy's sockets are the successor's: nothing of this one serves
		}
		a, sa := n.echo(t, 8080)
		b, _ := n.echo(t, 8081)
		n.apply(t, n.frontendOn(80, a, b))
		n.d.mu.Lock()
		skipped := n.d.syncKernelLocked(true)
		n.d.mu.Unlock()
		if len(skipped) > 0 {
			t.Fatalf("preparing the kernel's entries: %v", skipped[0].Err)
		}
		n.d.HandOver()
		if _, err := n.d.SetOwnerAdminState(a.Owner, AdminDown); err != nil {
			t.Fatal(err)
		}
		before := sa.accepted.Load()
		for i := range 6 {
			if err := n.roundTripNew(t, 80); err != nil {
				t.Fatalf("new connection %d: %v", i, err)
			}
		}
		if sa.accepted.Load() == before {
			t.Error("a data plane that had handed over changed the kernel's tables: a took no new connection after its Down")
		}
	})
}

// The fast path follows the frontends being served, not those of the last
// Apply: once closed, a data plane sets nothing (a frontend taken out
// after an Apply, as a kernel path without room does, no longer counts).
func TestAClosedDataPlaneSetsNoBackend(t *testing.T) {
	d := newDataPlane(t, Options{})
	a := newTestBackend(t)
	mustApply(t, d, tcpFrontend("fe", freeAddr(t, "tcp"), a.backend()))
	if n, err := d.SetOwnerAdminState(a.backend().Owner, AdminDown); err != nil || n != 1 {
		t.Fatalf("SetOwnerAdminState = %d, %v; want 1 backend set", n, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := d.SetOwnerAdminState(a.backend().Owner, AdminNone); err != nil || n != 0 {
		t.Errorf("after Close, SetOwnerAdminState = %d, %v; want 0 backends set", n, err)
	}
}
