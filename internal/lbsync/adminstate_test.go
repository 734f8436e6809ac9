package lbsync

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

func node(name string, uid types.UID, taints ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid}}
	for _, k := range taints {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: k, Effect: corev1.TaintEffectNoSchedule})
	}
	return n
}

// The fast path sets a tainted node's backends Down at once, does nothing
// when nothing changed, restores None when the taint goes, and does not
// carry Down over to a replacement node of the same name.
func TestAdminFastPath(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	at := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	dp, err := dataplane.New(dataplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	res, err := dp.Apply(dataplane.Config{Frontends: []dataplane.Frontend{{
		Name: "fe", Address: at.Addr().String(), Port: at.Port(),
		Backends: []dataplane.Backend{{Address: "10.0.0.1", Port: 30080, Owner: "n1"}, {Address: "10.0.0.2", Port: 30080, Owner: "n2"}},
	}}})
	if err == nil {
		err = res.Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	fast := newAdminFastPath(dp, lbmodel.Options{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go fast.run(ctx, logr.Discard())
	stateOf := func(owner string) dataplane.AdminState {
		for _, s := range dp.Status() {
			if s.Owner == owner {
				return s.AdminState
			}
		}
		return ""
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitState := func(owner string, want dataplane.AdminState) {
		t.Helper()
		waitFor(fmt.Sprintf("%s to be %s", owner, want), func() bool { return stateOf(owner) == want })
	}
	transitions := func() float64 {
		return testutil.ToFloat64(fast.transitions.WithLabelValues("Down")) + testutil.ToFloat64(fast.transitions.WithLabelValues("None"))
	}

	fast.observe(node("n1", "uid-1"))
	fast.observe(node("n2", "uid-2"))
	before := time.Now()
	fast.observe(node("n1", "uid-1", lbmodel.TaintDraining))
	waitState("n1", dataplane.AdminDown)
	// The applied state is stamped when it was applied, on the wall
	// clock, so that it can be compared with the taint's API write (the
	// gauge is set right after the data plane).
	waitFor("the applied timestamp", func() bool { return testutil.ToFloat64(fast.appliedAt.WithLabelValues("n1", "Down")) > 0 })
	if at := testutil.ToFloat64(fast.appliedAt.WithLabelValues("n1", "Down")); at < float64(before.UnixNano())/1e9 || at > float64(time.Now().UnixNano())/1e9 {
		t.Errorf("applied timestamp %f, want between %s and now", at, before)
	}
	if stateOf("n2") != dataplane.AdminNone {
		t.Error("an untainted node changed")
	}
	waitFor("the queue to empty", func() bool { return fast.queue.Len() == 0 })
	fast.observe(node("n1", "uid-1", lbmodel.TaintDraining, "unrelated"))
	fast.observe(node("n1", "uid-1", lbmodel.TaintDraining))
	// observe decides synchronously: an update without a change queues
	// nothing.
	if n := fast.queue.Len(); n != 0 {
		t.Errorf("%d queued for updates without a change, want 0", n)
	}
	if got := transitions(); got != 1 {
		t.Errorf("%v transitions for one change, want 1 (updates without a change are ignored)", got)
	}
	fast.observe(node("n1", "uid-1"))
	waitState("n1", dataplane.AdminNone)

	// The node is replaced: the new one (another UID) is healthy, though
	// the old one was last seen Down.
	fast.observe(node("n2", "uid-2", lbmodel.TaintOutOfService))
	waitState("n2", dataplane.AdminDown)
	fast.forget(node("n2", "uid-2"))
	fast.observe(node("n2", "uid-2b"))
	waitState("n2", dataplane.AdminNone)
	fast.mu.Lock()
	if w := fast.want["n2"]; w.node == nil || w.node.UID != "uid-2b" {
		t.Errorf("the fast path holds %+v for n2, want the replacement node", w)
	}
	fast.mu.Unlock()
	if got := testutil.ToFloat64(fast.transitions.WithLabelValues("Down")); got != 2 {
		t.Errorf("%v transitions to Down, want 2", got)
	}
}

// failingSetter fails until told otherwise.
type failingSetter struct {
	mu    sync.Mutex
	fail  bool
	calls int
	state dataplane.AdminState
}

func (f *failingSetter) SetOwnerAdminState(_ string, state dataplane.AdminState) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.fail {
		return 0, errors.New("backend pool is busy")
	}
	f.state = state
	return 1, nil
}

// A change that cannot be applied is retried with backoff until it is, and
// reported as one Warning event however many attempts fail.
func TestAdminFastPathRetriesAndReportsFailure(t *testing.T) {
	setter := &failingSetter{fail: true}
	recorder := events.NewFakeRecorder(10)
	fast := newAdminFastPath(setter, lbmodel.Options{}, recorder)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go fast.run(ctx, logr.Discard())

	fast.observe(node("n1", "uid-1", lbmodel.TaintDraining))
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(fast.errors) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%v failed attempts, want at least 3 (retries)", testutil.ToFloat64(fast.errors))
		}
		time.Sleep(5 * time.Millisecond)
	}
	setter.mu.Lock()
	setter.fail = false
	setter.mu.Unlock()
	for {
		setter.mu.Lock()
		state := setter.state
		setter.mu.Unlock()
		if state == dataplane.AdminDown {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the change was never applied after the failures stopped")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := len(recorder.Events); got != 1 {
		t.Fatalf("%d events, want 1 for one failing transition", got)
	}
	if ev := <-recorder.Events; !strings.Contains(ev, "Warning "+lbmodel.ReasonAdminStateUpdateFailed) || !strings.Contains(ev, "backend pool is busy") {
		t.Errorf("event %q", ev)
	}
	if got := testutil.ToFloat64(fast.transitions.WithLabelValues("Down")); got != 1 {
		t.Errorf("%v transitions to Down, want 1", got)
	}
}
