package nodemaintenance

import (
	"testing"
	"time"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/drainplan"
)

func plan(entries ...any) []v1alpha1.DrainPlanEntry {
	var out []v1alpha1.DrainPlanEntry
	for i := 0; i < len(entries); i += 2 {
		out = append(out, v1alpha1.DrainPlanEntry{PodPriority: int32(entries[i].(int)), PodType: entries[i+1].(v1alpha1.PodType)})
	}
	return out
}

// cluster holds pods by node, as Default priorities.
type cluster map[string][]int32

func (c cluster) remaining(node string, targets []v1alpha1.DrainPlanEntry) int {
	n := 0
	for _, p := range c[node] {
		for _, t := range targets {
			if t.PodType == v1alpha1.Default && p <= t.PodPriority {
				n++
				break
			}
		}
	}
	return n
}

type want struct {
	maintenance, node string
	priority          int32
	message           string
}

func check(t *testing.T, step string, r *resolution, wants []want) {
	t.Helper()
	for _, w := range wants {
		s := r.maintenances[w.maintenance]
		got := r.nodes[w.node]
		if lvl := drainplan.LevelOf(got.Targets); lvl.Priority != w.priority || lvl.Rank != 0 {
			t.Errorf("%s: %s node %s targets %v, want Default <= %d", step, w.maintenance, w.node, got.Targets, w.priority)
		}
		if msg := r.message(s, w.node); msg != w.message {
			t.Errorf("%s: %s node %s message %q, want %q", step, w.maintenance, w.node, msg, w.message)
		}
	}
}

// record stores what the statuses would show after a reconcile.
func record(r *resolution) {
	for _, s := range r.maintenances {
		s.Recorded = map[string][]v1alpha1.DrainPlanEntry{}
		for _, n := range s.Nodes {
			s.Recorded[n] = r.nodes[n].Targets
		}
	}
}

// The "Pod Selection and DrainTargets Example" of KEP-4212, step by step.
func TestResolveFollowsTheKEPExample(t *testing.T) {
	t0 := time.Now()
	a := &drainState{Name: "maintenance-a", Created: t0, Plan: plan(5000, v1alpha1.Default, 15000, v1alpha1.Default, 3000, v1alpha1.DaemonSet), Nodes: []string{"one", "two"}}
	b := &drainState{Name: "maintenance-b", Created: t0.Add(time.Second), Plan: plan(10000, v1alpha1.Default, 15000, v1alpha1.Default, 4000, v1alpha1.DaemonSet), Nodes: []string{"one", "three"}}
	pods := cluster{
		"one":   {1000, 5000, 8000, 12000},
		"two":   {1000, 12000},
		"three": {1000, 9000, 12000},
		"four":  {1000, 3000},
	}
	states := []*drainState{a, b}
	r := resolve(states, pods.remaining)
	check(t, "start", r, []want{
		{"maintenance-a", "one", 5000, "Evacuating"},
		{"maintenance-a", "two", 5000, "Evacuating"},
		{"maintenance-b", "one", 5000, "Evacuating (limited by maintenance-a)"},
		{"maintenance-b", "three", 10000, "Evacuating"},
	})
	record(r)

	// Node three drains: it waits for node one.
	pods["three"] = []int32{12000}
	r = resolve(states, pods.remaining)
	check(t, "three drained", r, []want{{"maintenance-b", "three", 10000, "Waiting for node one."}})
	record(r)

	// Node one drains to 5000: a waits for node two, b waits for a.
	pods["one"] = []int32{8000, 12000}
	r = resolve(states, pods.remaining)
	check(t, "one drained", r, []want{
		{"maintenance-a", "one", 5000, "Waiting for node two."},
		{"maintenance-a", "two", 5000, "Evacuating"},
		{"maintenance-b", "one", 5000, "Waiting for node two (maintenance-a)."},
		{"maintenance-b", "three", 10000, "Waiting for node two (maintenance-a)."},
	})
	if a.Index != 0 || b.Index != 0 {
		t.Fatalf("indexes %d %d moved too early", a.Index, b.Index)
	}
	record(r)

	// Node two drains: a moves to 15000, node one is now limited by b.
	pods["two"] = []int32{12000}
	r = resolve(states, pods.remaining)
	if a.Index != 1 || b.Index != 0 {
		t.Fatalf("indexes %d %d, want 1 0", a.Index, b.Index)
	}
	check(t, "two drained", r, []want{
		{"maintenance-a", "one", 10000, "Evacuating (limited by maintenance-b)"},
		{"maintenance-a", "two", 15000, "Evacuating"},
		{"maintenance-b", "one", 10000, "Evacuating"},
		{"maintenance-b", "three", 10000, "Waiting for node one."},
	})
	record(r)

	// A newer maintenance-c is fast-forwarded on node one; node four
	// follows its own plan.
	c := &drainState{Name: "maintenance-c", Created: t0.Add(time.Minute), Plan: plan(2000, v1alpha1.Default, 15000, v1alpha1.Default), Nodes: []string{"four", "one"}}
	states = append(states, c)
	r = resolve(states, pods.remaining)
	check(t, "c created", r, []want{
		{"maintenance-c", "one", 10000, "Evacuating (fast-forwarded by older maintenance-b)"},
		{"maintenance-c", "four", 2000, "Evacuating"},
		{"maintenance-a", "one", 10000, "Evacuating (limited by maintenance-b)"},
	})
	record(r)

	// Everything drains: every maintenance reaches its last entry.
	for n := range pods {
		pods[n] = nil
	}
	r = resolve(states, pods.remaining)
	for _, s := range states {
		if !r.drained(s) {
			t.Errorf("%s not drained at index %d", s.Name, s.Index)
		}
		for _, n := range s.Nodes {
			if msg := r.message(s, n); msg != "Drained" {
				t.Errorf("%s node %s: %q", s.Name, n, msg)
			}
		}
	}
}

// Issue 41 item 3: a node that joins a maintenance after its drain passed
// the first entry starts at the first entry and moves up with its own
// progress (it used to get the maintenance's current targets at once, so
// a CNI or log DaemonSet left together with the pods that need it). The
// maintenance waits for it before its next entry; its other nodes keep
// their targets (they never move back).
func TestANodeJoiningMidDrainStartsAtTheFirstEntry(t *testing.T) {
	a := &drainState{Name: "a", Plan: plan(100, v1alpha1.Default, 200, v1alpha1.Default, 300, v1alpha1.Default, 400, v1alpha1.Default), Nodes: []string{"n1"}}
	pods := cluster{"n1": {300}, "n2": {50, 150, 250}}
	resolve([]*drainState{a}, pods.remaining)
	if a.Index != 2 {
		t.Fatalf("index %d, want 2 (nothing at or below 200 on n1)", a.Index)
	}
	a.Nodes, a.Behind = []string{"n1", "n2"}, map[string]int{"n2": 0} // n2 joins
	r := resolve([]*drainState{a}, pods.remaining)
	check(t, "joined", r, []want{
		{"a", "n1", 300, "Evacuating"},
		{"a", "n2", 100, "Evacuating (joined the drain late: from the plan's first entry, now at entry 1 of 4)"},
	})
	pods["n1"] = nil // n1 is done with its entry, but a waits for n2
	r = resolve([]*drainState{a}, pods.remaining)
	if a.Index != 2 {
		t.Fatalf("a moved on to entry %d while n2 had not caught up", a.Index+1)
	}
	check(t, "n1 empty", r, []want{{"a", "n2", 100, "Evacuating (joined the drain late: from the plan's first entry, now at entry 1 of 4)"}})
	if got := r.message(a, "n1"); got != "Waiting for node n2." {
		t.Errorf("n1 says %q", got)
	}
	pods["n2"] = []int32{150, 250}
	r = resolve([]*drainState{a}, pods.remaining)
	check(t, "n2 one step up", r, []want{{"a", "n2", 200, "Evacuating (joined the drain late: from the plan's first entry, now at entry 2 of 4)"}})
	pods["n2"] = []int32{250}
	r = resolve([]*drainState{a}, pods.remaining)
	if a.Index != 2 || len(a.Behind) != 0 {
		t.Fatalf("index %d, behind %v: n2 caught up with entry 3 and still has a pod there", a.Index, a.Behind)
	}
	check(t, "caught up", r, []want{{"a", "n1", 300, "Waiting for node n2."}, {"a", "n2", 300, "Evacuating"}})
	pods["n2"] = nil
	resolve([]*drainState{a}, pods.remaining)
	if a.Index != 3 {
		t.Errorf("index %d, want 3 once both nodes are done with entry 3", a.Index)
	}
}

// Targets never move backwards: a pod appearing later that an earlier
// step selected is targeted again without the index going back.
func TestResolveNeverBacktracks(t *testing.T) {
	a := &drainState{Name: "a", Plan: plan(100, v1alpha1.Default, 200, v1alpha1.Default, 300, v1alpha1.Default), Nodes: []string{"n1"}}
	pods := cluster{"n1": {100, 300}, "n2": {50, 250}}
	resolve([]*drainState{a}, pods.remaining)
	if a.Index != 0 {
		t.Fatalf("index %d", a.Index)
	}
	pods["n1"] = []int32{300}
	r := resolve([]*drainState{a}, pods.remaining)
	if a.Index != 2 || r.message(a, "n1") != "Evacuating" {
		t.Fatalf("index %d message %q, want 2 (200 had nothing to do)", a.Index, r.message(a, "n1"))
	}
	pods["n1"] = []int32{100} // a new low-priority pod
	a.Nodes = []string{"n1", "n2"}
	r = resolve([]*drainState{a}, pods.remaining)
	if a.Index != 2 || r.remaining["n1"] != 1 || r.remaining["n2"] != 2 {
		t.Fatalf("index %d remaining %v", a.Index, r.remaining)
	}
	// A node leaving the selector drops out of the resolution; the
	// maintenance goes on with the rest.
	a.Nodes = []string{"n2"}
	r = resolve([]*drainState{a}, pods.remaining)
	if _, ok := r.nodes["n1"]; ok || a.Index != 2 {
		t.Fatalf("after n1 left: nodes %v, index %d", r.nodes, a.Index)
	}
	a.Nodes = []string{"n1", "n2"}
	// Ties: two maintenances at the same level; the older one is named.
	b := &drainState{Name: "b", Created: time.Now(), Plan: plan(300, v1alpha1.Default), Nodes: []string{"n1"}}
	r = resolve([]*drainState{a, b}, pods.remaining)
	if got := r.message(b, "n1"); got != "Evacuating" {
		t.Errorf("equal levels: %q", got)
	}
}

// A maintenance whose node was fast-forwarded by another's recorded
// targets still moves on once the pods of its own entry are gone, even
// while the fast-forwarded targets have pods left.
func TestResolveAdvancesBehindAFloor(t *testing.T) {
	a := &drainState{Name: "a", Plan: plan(100, v1alpha1.Default, 1000000000, v1alpha1.Default), Nodes: []string{"x"},
		Recorded: map[string][]v1alpha1.DrainPlanEntry{}}
	b := &drainState{Name: "b", Created: time.Now(), Plan: plan(1000, v1alpha1.Default, 1000000000, v1alpha1.Default), Nodes: []string{"x"},
		Recorded: map[string][]v1alpha1.DrainPlanEntry{"x": drainplan.TargetsAt(plan(1000, v1alpha1.Default), 0)}}
	pods := cluster{"x": {1000}}
	r := resolve([]*drainState{a, b}, pods.remaining)
	if a.Index != 1 {
		t.Fatalf("a at index %d, want 1: its own entry (<= 100) has no pod left", a.Index)
	}
	if got := r.message(a, "x"); got != "Evacuating (limited by b)" {
		t.Errorf("message %q", got)
	}
}

// Issue 41 item 8: drainMessage named the wrong maintenance. A node whose
// targets come from the maintenance's own earlier status (they never move
// back, here after the maintenance that fast-forwarded it left) said it
// was "fast-forwarded by older" itself; and a wait was followed one step
// only, naming an empty node that itself waits on another.
func TestDrainMessagesNameWhatReallyHoldsTheDrain(t *testing.T) {
	t.Run("own earlier targets", func(t *testing.T) {
		a := &drainState{Name: "a", Plan: plan(100, v1alpha1.Default, 1000, v1alpha1.Default, 1000000000, v1alpha1.Default), Nodes: []string{"x"},
			Recorded: map[string][]v1alpha1.DrainPlanEntry{"x": drainplan.TargetsAt(plan(100, v1alpha1.Default, 1000, v1alpha1.Default), 1)}}
		pods := cluster{"x": {50, 500}}
		r := resolve([]*drainState{a}, pods.remaining)
		if got, want := r.message(a, "x"), "Evacuating (targets reached earlier on this node; they never move back)"; got != want {
			t.Errorf("message %q, want %q", got, want)
		}
	})
	t.Run("a chain of waits", func(t *testing.T) {
		t0 := time.Now()
		c := &drainState{Name: "c", Created: t0, Plan: plan(10, v1alpha1.Default, 20, v1alpha1.Default), Nodes: []string{"n3", "n4"}}
		b := &drainState{Name: "b", Created: t0.Add(time.Second), Plan: plan(20, v1alpha1.Default, 30, v1alpha1.Default), Nodes: []string{"n2", "n3"}}
		a := &drainState{Name: "a", Created: t0.Add(2 * time.Second), Plan: plan(30, v1alpha1.Default, 40, v1alpha1.Default), Nodes: []string{"n1", "n2"}}
		pods := cluster{"n4": {5}}
		r := resolve([]*drainState{a, b, c}, pods.remaining)
		for _, w := range []struct {
			s          *drainState
			node, want string
		}{
			{a, "n1", "Waiting for node n4 (c)."},
			{b, "n2", "Waiting for node n4 (c)."},
			{c, "n3", "Waiting for node n4."},
			{c, "n4", "Evacuating"},
		} {
			if got := r.message(w.s, w.node); got != w.want {
				t.Errorf("%s on %s: %q, want %q", w.s.Name, w.node, got, w.want)
			}
		}
	})
}
