package dataplane

import (
	"slices"
)

// How the kernel engine picks a backend for a new flow, in three lookups
// of its maps (see pickExprs):
//
//	homes:    frontend . slot         -> the owner (node) of the slot's home backend
//	owners:   owner                   -> 0 while the owner is up, 1 while it is admin Down
//	backends: frontend . slot . state -> backend address . port
//
// A slot's home backend is the one that holds it when every backend is
// eligible. Each slot has two entries, one for each state of its home's
// owner: the entry of the state the owner is in says where the slot's
// flows go now (the same backend assignSlots gives); the other is
// prepared for the owner's next change. A node that starts or stops
// leaving so usually changes one element of the owners map, whatever the
// number of frontends and slots it has: the admin-state fast path is one
// small transaction. The prepared entries depend on the other backends'
// eligibility, so they are brought up to date afterwards, off the fast
// path (planSlots' prepare).

// ownerState is an owner's state in the owners map.
type ownerState uint32

const (
	ownerUp   ownerState = 0
	ownerDown ownerState = 1
)

// ownerTable is one table's (address family's) owners: an id for each
// owner of a kernel frontend's backends (ids start at 1, in name order,
// so that they only change when the structure does), and each owner's
// state, indexed by id. An owner is down when any of its backends is
// admin Down.
type ownerTable struct {
	ids   map[string]uint32
	state []ownerState
}

func newOwnerTable(sets []*backendSet) ownerTable {
	var names []string
	down := map[string]bool{}
	for _, set := range sets {
		for _, b := range set.backends {
			if _, seen := down[b.owner]; !seen {
				names = append(names, b.owner)
				down[b.owner] = false
			}
			if adminState(b.admin.Load()) == adminDown {
				down[b.owner] = true
			}
		}
	}
	slices.Sort(names)
	t := ownerTable{ids: make(map[string]uint32, len(names)), state: make([]ownerState, len(names)+1)}
	for i, name := range names {
		id := uint32(i + 1)
		t.ids[name] = id
		if down[name] {
			t.state[id] = ownerDown
		}
	}
	return t
}

// slotPlan is what the maps hold for one frontend: its slots' homes and
// the owner id of each slot's home, and the backend index of each slot for
// either state of that owner (-1: no backend, the lookup misses and the
// flow is reset).
type slotPlan struct {
	slotHomes
	homes   []uint32
	entries [2][]int32
}

// setEligibility is, by backend index, each backend's eligibility when a
// sync began, and what it would be if its owner came back (an admin Down
// backend as if None; for the prepared entries).
type setEligibility struct {
	now, back []bool
}

func eligibilityOf(set *backendSet) setEligibility {
	both := make([]bool, 2*len(set.backends)) // one allocation: this is the fast path
	e := setEligibility{now: both[:len(set.backends)], back: both[len(set.backends):]}
	for j, b := range set.backends {
		admin := adminState(b.admin.Load())
		e.now[j] = b.eligibleAs(admin)
		e.back[j] = b.eligibleAs(backAs(admin))
	}
	return e
}

// planSlots computes a frontend's slots. The entries of each slot's
// current state are exact; the other state's entries are prepared when
// prepare is set, else taken from prev (which must be the same set's
// plan), since only the next change of an owner reads them.
func planSlots(set *backendSet, owners ownerTable, elig setEligibility, prev *slotPlan, prepare bool) slotPlan {
	var p slotPlan
	if prev != nil {
		p.slotHomes, p.homes = prev.slotHomes, prev.homes // they depend on the set only
	} else {
		p.slotHomes = newSlotHomes(set, slotCount(set))
		p.homes = make([]uint32, len(p.home))
		for s, j := range p.home {
			p.homes[s] = owners.ids[set.backends[j].owner]
		}
	}
	n := len(p.home)
	both := make([]int32, 2*n) // one allocation: this is the fast path
	p.entries = [2][]int32{both[:n], both[n:]}
	now := func(j int) bool { return elig.now[j] }
	for s := range n {
		state := owners.state[p.homes[s]]
		p.entries[state][s] = int32(p.assign(set, s, now))
		if prev != nil && !prepare {
			p.entries[1-state][s] = prev.entries[1-state][s]
			continue
		}
		// The other state of the slot's home owner: its backends out
		// (it goes Down) or back as if None (it comes back), the
		// others as they are now.
		owner := set.backends[p.home[s]].owner
		p.entries[1-state][s] = int32(p.assign(set, s, func(j int) bool {
			switch {
			case set.backends[j].owner != owner:
				return elig.now[j]
			case state == ownerUp:
				return false
			default:
				return elig.back[j]
			}
		}))
	}
	return p
}
