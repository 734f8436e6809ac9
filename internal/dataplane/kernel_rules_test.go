package dataplane

import (
	"net/netip"
	"testing"
)

// Slots: shared by weight and interleaved; a backend that becomes
// ineligible hands only its own slots on, by weight; none eligible, none
// filled.
func TestAssignSlots(t *testing.T) {
	a, b, c := slotBackend(1, 2), slotBackend(2, 1), slotBackend(3, 1)
	set := &backendSet{backends: []*backend{a, b, c}}
	n := slotCount(set)
	if n != 4*slotsPerWeight {
		t.Fatalf("%d slots for a total weight of 4, want %d", n, 4*slotsPerWeight)
	}
	all := map[*backend]bool{a: true, b: true, c: true}
	for _, tc := range []struct {
		name     string
		eligible map[*backend]bool
		want     map[int]int // slots per backend index
	}{
		{name: "all eligible", eligible: all, want: map[int]int{0: n / 2, 1: n / 4, 2: n / 4}},
		// b's 4 slots go 3 to a, 1 to c (weights 2:1).
		{name: "b out", eligible: map[*backend]bool{a: true, c: true}, want: map[int]int{0: 11, 1: 0, 2: 5}},
		// b's and c's slots go to a, the only one left.
		{name: "b and c out", eligible: map[*backend]bool{a: true}, want: map[int]int{0: 16}},
		{name: "none", eligible: map[*backend]bool{}, want: map[int]int{-1: n}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := assignSlots(set, func(b *backend) bool { return tc.eligible[b] }, n)
			count := map[int]int{}
			for _, j := range got {
				count[j]++
			}
			for j, w := range tc.want {
				if count[j] != w {
					t.Errorf("backend %d has %d slots, want %d (slots %v)", j, count[j], w, got)
				}
			}
			base := assignSlots(set, func(b *backend) bool { return all[b] }, n)
			for s := range got {
				if tc.eligible[set.backends[base[s]]] && got[s] != base[s] {
					t.Errorf("slot %d moved from eligible backend %d to %d", s, base[s], got[s])
				}
			}
		})
	}
	// Interleaved: the first four slots are not all one backend's.
	first := assignSlots(set, func(b *backend) bool { return all[b] }, n)[:4]
	if first[0] == first[1] && first[1] == first[2] {
		t.Errorf("slots are not interleaved: %v", first)
	}
}

// Heirs: an ineligible backend's slots go to the eligible ones by weight;
// when an heir leaves too, its inherited slots spread by hashing, by
// weight again; and a backend leaving moves only the slots it held.
func TestReassignHeirs(t *testing.T) {
	set := &backendSet{backends: []*backend{slotBackend(9, 1), slotBackend(1, 2), slotBackend(2, 1), slotBackend(3, 1), slotBackend(4, 2)}}
	home := make([]int, 6000) // every slot on backend 0
	spread := func(what string, out []int, want map[int]int) {
		t.Helper()
		count := map[int]int{}
		for _, j := range out {
			count[j]++
		}
		for j, w := range want {
			if got := count[j]; got < w*85/100 || got > w*115/100 {
				t.Errorf("%s: backend %d (weight %d) holds %d of %d slots, want %d within 15%%", what, j, set.backends[j].weight.Load(), got, len(out), w)
			}
		}
	}
	homes := slotHomesFrom(set, home)
	one := homes.assignAll(set, func(j int) bool { return j != 0 })
	spread("backend 0 out", one, map[int]int{1: 2000, 2: 1000, 3: 1000, 4: 2000})
	two := homes.assignAll(set, func(j int) bool { return j != 0 && j != 4 })
	spread("backends 0 and 4 out", two, map[int]int{1: 3000, 2: 1500, 3: 1500})
	for s := range one {
		if one[s] != 4 && two[s] != one[s] {
			t.Fatalf("slot %d moved from backend %d to %d when backend 4 left", s, one[s], two[s])
		}
	}
}

func slotBackend(i, weight int) *backend {
	b := &backend{key: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), 80)}
	b.slotSeed = addrSeed(b.key.String())
	b.weight.Store(int32(weight))
	return b
}
