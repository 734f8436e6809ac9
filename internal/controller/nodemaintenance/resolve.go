package nodemaintenance

import (
	"fmt"
	"slices"
	"sort"
	"time"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/drainplan"
)

// drainState is one maintenance in the Drain stage, as resolution sees it.
type drainState struct {
	Name    string
	Created time.Time
	Plan    []v1alpha1.DrainPlanEntry
	// Index is the plan entry reached.
	Index int
	// Behind holds the nodes that joined the drain after it had passed
	// the first entry, and have not caught up yet: the entry each has
	// reached. A joining node starts at the first entry and moves up with
	// its own progress, so that the pods that others depend on (a
	// DaemonSet's: CNI, CSI, logs) do not leave with them at once. Every
	// other node is at Index.
	Behind map[string]int
	// Nodes it selects, sorted.
	Nodes []string
	// Recorded is the drain targets its status shows per node: targets
	// never move backwards, so they are a floor for every maintenance on
	// that node.
	Recorded map[string][]v1alpha1.DrainPlanEntry
}

func (d *drainState) own() []v1alpha1.DrainPlanEntry { return drainplan.TargetsAt(d.Plan, d.Index) }
func (d *drainState) last() bool                     { return d.Index >= len(d.Plan)-1 }

// at is the plan entry node has reached in d: Index, or less for a node
// that joined late.
func (d *drainState) at(node string) int {
	if i, ok := d.Behind[node]; ok && i < d.Index {
		return i
	}
	return d.Index
}

func (d *drainState) behind(node string) bool { return d.at(node) < d.Index }
func (d *drainState) ownOn(node string) []v1alpha1.DrainPlanEntry {
	return drainplan.TargetsAt(d.Plan, d.at(node))
}
func (d *drainState) levelOn(node string) drainplan.Level {
	return drainplan.LevelAt(d.Plan, d.at(node))
}
func (d *drainState) lastOn(node string) bool { return d.at(node) >= len(d.Plan)-1 }

// catchUp moves each node of d that joined late one entry up when the
// pods of its own entry are gone, and reports whether one moved.
func (r *resolution) catchUp(d *drainState) bool {
	moved := false
	for _, node := range d.Nodes {
		if !d.behind(node) {
			continue
		}
		if t := r.nodes[node]; drainplan.Covers(t.Targets, d.ownOn(node)) && r.count(node, d.ownOn(node)) == 0 {
			d.Behind[node]++
			if d.Behind[node] >= d.Index {
				delete(d.Behind, node)
			}
			moved = true
		}
	}
	return moved
}

// older orders maintenances by age, then name.
func older(a, b *drainState) bool {
	if !a.Created.Equal(b.Created) {
		return a.Created.Before(b.Created)
	}
	return a.Name < b.Name
}

// nodeTargets is what applies on one node: the targets, the level, and
// which maintenance they come from.
type nodeTargets struct {
	Targets []v1alpha1.DrainPlanEntry
	Level   drainplan.Level
	// From is the maintenance whose targets apply.
	From string
	// Floor is set when the targets come from an earlier step recorded in
	// a status (they never move backwards) rather than from a plan.
	Floor bool
}

// remainingFunc counts the pods on a node that the targets select and
// that still exist (static pods excluded: they cannot be evacuated
// through the API).
type remainingFunc func(node string, targets []v1alpha1.DrainPlanEntry) int

// resolution is the outcome for every maintenance in Drain.
type resolution struct {
	maintenances map[string]*drainState
	nodes        map[string]nodeTargets
	remaining    map[string]int
	count        remainingFunc
}

// resolve computes the drain targets of every node under a maintenance in
// Drain, following KEP-4212: on a node covered by several maintenances the
// least advanced one's targets apply; targets never move backwards (a
// newer maintenance is fast-forwarded); a maintenance moves to its next
// plan entry only when every one of its nodes has no pod left for targets
// that reach its own entry. Advancing is repeated until nothing can move,
// so empty steps pass at once. The maintenances' Index fields are updated.
func resolve(states []*drainState, remaining remainingFunc) *resolution {
	r := &resolution{maintenances: map[string]*drainState{}, count: remaining}
	for _, s := range states {
		r.maintenances[s.Name] = s
	}
	for {
		r.computeNodes(remaining)
		moved := false
		for _, s := range r.sorted() {
			if r.catchUp(s) {
				moved = true
				continue // the targets changed: look again before advancing
			}
			if !s.last() && r.finished(s) {
				s.Index++
				moved = true
			}
		}
		if !moved {
			return r
		}
	}
}

func (r *resolution) sorted() []*drainState {
	out := make([]*drainState, 0, len(r.maintenances))
	for _, s := range r.maintenances {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return older(out[i], out[j]) })
	return out
}

// covering returns the maintenances selecting node, oldest first.
func (r *resolution) covering(node string) []*drainState {
	var out []*drainState
	for _, s := range r.sorted() {
		if slices.Contains(s.Nodes, node) {
			out = append(out, s)
		}
	}
	return out
}

func (r *resolution) computeNodes(remaining remainingFunc) {
	r.nodes, r.remaining = map[string]nodeTargets{}, map[string]int{}
	for _, s := range r.sorted() {
		for _, node := range s.Nodes {
			if _, done := r.nodes[node]; done {
				continue
			}
			t := r.least(node)
			for _, c := range r.covering(node) {
				// Targets never move backwards: every pod a status has
				// published as targeted stays targeted. Compared as the
				// pods they select, not by level: targets with selectors
				// may each select pods the other does not.
				if rec, ok := c.Recorded[node]; ok && !drainplan.Covers(t.Targets, rec) {
					t = nodeTargets{Targets: drainplan.Union(t.Targets, rec), From: c.Name, Floor: true}
				}
			}
			t.Level = drainplan.LevelOf(t.Targets)
			r.nodes[node] = t
			r.remaining[node] = remaining(node, t.Targets)
		}
	}
}

// least returns the targets of the least advanced maintenance on node. A
// maintenance at its last entry has no order left to keep, so it limits
// no one; when all are there, the most advanced one's targets apply.
func (r *resolution) least(node string) nodeTargets {
	var t nodeTargets
	found := false
	for _, c := range r.covering(node) {
		if l := c.levelOn(node); !c.lastOn(node) && (!found || l.Less(t.Level)) {
			t, found = nodeTargets{Targets: c.ownOn(node), Level: l, From: c.Name}, true
		}
	}
	if found {
		return t
	}
	for i, c := range r.covering(node) {
		if l := c.levelOn(node); i == 0 || t.Level.Less(l) {
			t = nodeTargets{Targets: c.ownOn(node), Level: l, From: c.Name}
		}
	}
	return t
}

// finished reports whether every node of s has no pod left for targets
// that reach s's own plan entry.
func (r *resolution) finished(s *drainState) bool {
	return r.blocker(s) == ""
}

// blocker returns the first node of s that keeps it from its next entry:
// one that joined late and has not caught up, one whose targets do not
// reach s's own entry yet, or one that still has pods s's own targets
// select. (A node fast-forwarded beyond s's entry only needs the pods of
// s's entry gone.)
func (r *resolution) blocker(s *drainState) string {
	own := s.own()
	for _, node := range s.Nodes {
		t := r.nodes[node]
		if s.behind(node) || !drainplan.Covers(t.Targets, own) || r.count(node, own) > 0 {
			return node
		}
	}
	return ""
}

// drained reports whether s has reached its last entry with nothing left.
func (r *resolution) drained(s *drainState) bool { return s.last() && r.finished(s) }

// message explains one node's drain in maintenance s, in the KEP's words,
// naming the maintenance and node that really hold it.
func (r *resolution) message(s *drainState, node string) string {
	t := r.nodes[node]
	if r.remaining[node] > 0 {
		switch own := s.ownOn(node); {
		case s.behind(node) && drainplan.Covers(t.Targets, own):
			return fmt.Sprintf("Evacuating (joined the drain late: from the plan's first entry, now at entry %d of %d)", s.at(node)+1, len(s.Plan))
		case !drainplan.Covers(t.Targets, own):
			return fmt.Sprintf("Evacuating (limited by %s)", r.limitedBy(node, own, t))
		case !drainplan.Covers(own, t.Targets):
			by := r.limiter(node, t)
			switch o := r.maintenances[by]; {
			case by == s.Name:
				// s's own status recorded these targets, when another
				// maintenance had fast-forwarded the node (since gone).
				return "Evacuating (targets reached earlier on this node; they never move back)"
			case o != nil && older(o, s):
				return fmt.Sprintf("Evacuating (fast-forwarded by older %s)", by)
			default:
				return fmt.Sprintf("Evacuating (fast-forwarded by %s)", by)
			}
		default:
			return "Evacuating"
		}
	}
	if r.drained(s) {
		return "Drained"
	}
	if r.finished(s) {
		return "Evacuating"
	}
	return r.waiting(s, node)
}

// limiter names the maintenance whose progress holds a node back: the
// oldest one on it whose own entry is at the node's level.
func (r *resolution) limiter(node string, t nodeTargets) string {
	for _, c := range r.covering(node) {
		if c.levelOn(node) == t.Level {
			return c.Name
		}
	}
	return t.From
}

// limitedBy names the maintenance that keeps a node's targets from
// selecting every pod of own: the oldest one on it, not at its last entry,
// whose own targets there do not.
func (r *resolution) limitedBy(node string, own []v1alpha1.DrainPlanEntry, t nodeTargets) string {
	for _, c := range r.covering(node) {
		if !c.lastOn(node) && !drainplan.Covers(c.ownOn(node), own) {
			return c.Name
		}
	}
	return r.limiter(node, t)
}

// waiting says which node, of which maintenance, s is waiting for.
func (r *resolution) waiting(s *drainState, node string) string {
	if r.blocker(s) == "" {
		return "Evacuating"
	}
	held, by := r.holder(s, map[string]bool{})
	switch {
	case by == s.Name && held == node:
		return "Evacuating"
	case by == s.Name:
		return fmt.Sprintf("Waiting for node %s.", held)
	case held == "":
		return fmt.Sprintf("Waiting for %s.", by)
	default:
		return fmt.Sprintf("Waiting for node %s (%s).", held, by)
	}
}

// holder follows what keeps s from its next entry to its end: a node of
// some maintenance that still has pods to evacuate (or whose targets do
// not reach that maintenance's entry for a reason of its own), or a
// maintenance about to move on (held ""). A blocking node that is empty
// but held back by a less advanced maintenance passes the question on to
// that one, as far as the chain goes.
func (r *resolution) holder(s *drainState, seen map[string]bool) (held, by string) {
	seen[s.Name] = true
	b := r.blocker(s)
	if b == "" {
		return "", s.Name
	}
	t := r.nodes[b]
	if r.remaining[b] > 0 || s.behind(b) || drainplan.Covers(t.Targets, s.own()) {
		return b, s.Name
	}
	other := r.maintenances[r.limitedBy(b, s.own(), t)]
	if other == nil || seen[other.Name] {
		return b, s.Name
	}
	return r.holder(other, seen)
}
