package l2

import (
	"net/netip"
	"slices"
	"testing"
)

// elect runs owned for every replica as each would, from its own view.
func elect(offers map[string][]netip.Addr) map[netip.Addr][]string {
	owners := map[netip.Addr][]string{}
	for self, offer := range offers {
		peers := map[string][]netip.Addr{}
		for node, o := range offers {
			if node != self {
				s := slices.Clone(o)
				slices.SortFunc(s, netip.Addr.Compare)
				peers[node] = s
			}
		}
		for _, a := range owned(self, offer, peers) {
			owners[a] = append(owners[a], self)
		}
	}
	return owners
}

func TestEveryAddressHasExactlyOneOwner(t *testing.T) {
	all := addrs(100)
	tests := []struct {
		name   string
		offers map[string][]netip.Addr
	}{
		{"one replica", map[string][]netip.Addr{"a": all}},
		{"two replicas", map[string][]netip.Addr{"a": all, "b": all}},
		{"three replicas", map[string][]netip.Addr{"a": all, "b": all, "c": all}},
		{"one withdrawn", map[string][]netip.Addr{"a": all, "b": {}, "c": all}},
		{"one serving half", map[string][]netip.Addr{"a": all, "b": all[:50]}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			owners := elect(tc.offers)
			for _, a := range all {
				o := owners[a]
				if len(o) != 1 {
					t.Fatalf("%s has owners %v, want exactly one", a, o)
				}
				if !slices.Contains(tc.offers[o[0]], a) {
					t.Fatalf("%s is owned by %s, which does not offer it", a, o[0])
				}
			}
			// Spread: every replica offering everything owns some.
			count := map[string]int{}
			for _, o := range owners {
				count[o[0]]++
			}
			for node, offer := range tc.offers {
				if len(offer) == len(all) && count[node] == 0 {
					t.Errorf("%s owns none of %d addresses: %v", node, len(all), count)
				}
			}
		})
	}
}

// A replica that leaves gives up only its own addresses; the others keep
// theirs (nothing else moves, so no other connection is disturbed).
func TestOnlyALeavingReplicasAddressesMove(t *testing.T) {
	all := addrs(100)
	before := elect(map[string][]netip.Addr{"a": all, "b": all, "c": all})
	after := elect(map[string][]netip.Addr{"a": all, "c": all})
	moved := 0
	for _, a := range all {
		if before[a][0] != "b" && before[a][0] != after[a][0] {
			t.Errorf("%s moved from %s to %s though its owner stayed", a, before[a][0], after[a][0])
		}
		if before[a][0] == "b" {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("b owned nothing")
	}
}
