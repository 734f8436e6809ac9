package dataplane

import (
	"fmt"
	"testing"
)

// slotTestSet is a frontend of backends owned by nodes a, b, c (weights 2,
// 1, 1) and a fourth backend of a: a node in pod mode holds several.
func slotTestSet() *backendSet {
	set := &backendSet{}
	for i, owner := range []string{"a", "b", "c", "a"} {
		b := slotBackend(i+1, []int{2, 1, 1, 1}[i])
		b.owner = owner
		set.backends = append(set.backends, b)
	}
	return set
}

func setOwner(set *backendSet, owner string, state adminState) {
	for _, b := range set.backends {
		if b.owner == owner {
			b.admin.Store(int32(state))
		}
	}
}

// plan is planSlots as the kernel engine calls it for one frontend.
func plan(set *backendSet, prev *slotPlan, prepare bool) (slotPlan, ownerTable) {
	owners := newOwnerTable([]*backendSet{set})
	return planSlots(set, owners, eligibilityOf(set), prev, prepare), owners
}

// exact is where each slot's flows must go: assignSlots over the backends'
// eligibility now.
func exact(set *backendSet) []int {
	return assignSlots(set, func(b *backend) bool { return b.eligible() }, slotCount(set))
}

// The entries in use are exact whatever was prepared; and once prepared,
// a node's change while every other node's backends are eligible is one
// owner entry: the entries it switches to are the exact ones. (While
// another node is out, the slots it orphaned may have their heirs on the
// changing node: those entries, and only those, are rewritten.)
func TestPlanSlots(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(set *backendSet)
	}{
		{name: "all up", setup: func(*backendSet) {}},
		{name: "b down", setup: func(set *backendSet) { setOwner(set, "b", adminDown) }},
		{name: "a and c down", setup: func(set *backendSet) { setOwner(set, "a", adminDown); setOwner(set, "c", adminDown) }},
		{name: "c removed", setup: func(set *backendSet) { set.backends[2].removed.Store(true) }},
		{name: "a down, b up", setup: func(set *backendSet) { setOwner(set, "a", adminDown); setOwner(set, "b", adminUp) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := slotTestSet()
			tc.setup(set)
			prepared, owners := plan(set, nil, true)
			inUse(t, "prepared", set, &prepared, owners)
			for _, owner := range []string{"a", "b", "c"} {
				t.Run("then "+owner+" changes", func(t *testing.T) {
					was := adminState(set.backends[0].admin.Load())
					for _, b := range set.backends {
						if b.owner == owner {
							was = adminState(b.admin.Load())
						}
					}
					next := adminDown
					if was == adminDown {
						next = adminNone
					}
					setOwner(set, owner, next)
					defer setOwner(set, owner, was)
					othersEligible := true
					for _, b := range set.backends {
						othersEligible = othersEligible && (b.owner == owner || b.eligible())
					}
					fast, owners := plan(set, &prepared, false)
					inUse(t, "fast path", set, &fast, owners)
					if othersEligible && fmt.Sprint(fast.entries) != fmt.Sprint(prepared.entries) {
						t.Errorf("the change rewrote entries %v -> %v; want only its owner's state changed", prepared.entries, fast.entries)
					}
					// Otherwise only entries from or to the owner's
					// backends change: the heirs of other slots stay.
					ofOwner := func(j int32) bool { return j >= 0 && set.backends[j].owner == owner }
					for state := range fast.entries {
						for s, j := range fast.entries[state] {
							if was := prepared.entries[state][s]; was != j && !ofOwner(was) && !ofOwner(j) {
								t.Errorf("entry (slot %d, state %d) moved from backend %d to %d, neither of them %s's", s, state, was, j, owner)
							}
						}
					}
				})
			}
		})
	}
}

// Two nodes change before the entries are prepared again: the second
// change must rewrite entries (the first's heirs may be on it), and what
// is in use stays exact.
func TestPlanSlotsUnpreparedChanges(t *testing.T) {
	set := slotTestSet()
	prepared, _ := plan(set, nil, true)
	setOwner(set, "a", adminDown)
	first, owners := plan(set, &prepared, false)
	inUse(t, "a down", set, &first, owners)
	setOwner(set, "b", adminDown)
	second, owners := plan(set, &first, false)
	inUse(t, "a and b down", set, &second, owners)
	setOwner(set, "a", adminNone)
	third, owners := plan(set, &second, false)
	inUse(t, "a back, b down", set, &third, owners)
}

// inUse fails the test unless every slot's entry in use, the one for its
// home owner's state, is where exact says its flows must go.
func inUse(t *testing.T, what string, set *backendSet, p *slotPlan, owners ownerTable) {
	t.Helper()
	want := exact(set)
	for s := range want {
		if got := int(p.entries[owners.state[p.homes[s]]][s]); got != want[s] {
			t.Errorf("%s: slot %d goes to backend %d, want %d", what, s, got, want[s])
		}
	}
}
