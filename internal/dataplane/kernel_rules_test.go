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
		{name: "none", eligible: map[*backend]bool{}, want: map[int]int{-1: n}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := assignSlots(set, tc.eligible, n)
			count := map[int]int{}
			for _, j := range got {
				count[j]++
			}
			for j, w := range tc.want {
				if count[j] != w {
					t.Errorf("backend %d has %d slots, want %d (slots %v)", j, count[j], w, got)
				}
			}
			base := assignSlots(set, all, n)
			for s := range got {
				if tc.eligible[set.backends[base[s]]] && got[s] != base[s] {
					t.Errorf("slot %d moved from eligible backend %d to %d", s, base[s], got[s])
				}
			}
		})
	}
	// Interleaved: the first four slots are not all one backend's.
	first := assignSlots(set, all, n)[:4]
	if first[0] == first[1] && first[1] == first[2] {
		t.Errorf("slots are not interleaved: %v", first)
	}
}

func slotBackend(i, weight int) *backend {
	b := &backend{key: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), 80)}
	b.weight.Store(int32(weight))
	return b
}
