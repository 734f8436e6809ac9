package lb

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// A process that restarts with no predecessor (after a crash) holds its
// BGP sessions back until its first configuration is applied, not until
// it serves in full: serving also waits for the L2 keys, which protect a
// take-over only, and a host whose keys never came would never have
// opened its sessions nor become ready. Readiness does not wait for BGP.
func TestARestartOpensItsHeldSessionsOnceSynced(t *testing.T) {
	var synced atomic.Bool
	addrs := &addressSinks{bgpDeferred: true}
	h := &handover{log: logr.Discard(), addrs: addrs, synced: synced.Load}
	serving := func() bool { return false } // the L2 keys never come
	done := make(chan bool)
	go func() { done <- h.takeOver(context.Background(), serving) }()

	deadline := time.Now().Add(5 * time.Second)
	for !h.ready() {
		if time.Now().After(deadline) {
			t.Fatal("not ready before its first sync: readiness waits for BGP")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if !addrs.bgpWaiting() {
		t.Fatal("the sessions opened before the first sync")
	}
	synced.Store(true)
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("takeOver gave up")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the sessions never opened: takeOver waits for what serving adds")
	}
	if addrs.bgpWaiting() {
		t.Error("the sessions still wait after the first sync")
	}
}
