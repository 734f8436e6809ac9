package l2

import (
	"crypto/sha256"
	"encoding/binary"
	"net/netip"
	"slices"
)

// owned returns the addresses of offer that self owns: for each address,
// among the replicas offering it (self, and the live peers that do), the
// one with the highest score. Every replica that hears the same peers
// computes the same owners with no coordination, and when a replica
// leaves, only its own addresses move (rendezvous hashing), each to a
// different survivor, so addresses spread across replicas.
func owned(self string, offer []netip.Addr, peers map[string][]netip.Addr) []netip.Addr {
	var mine []netip.Addr
	for _, a := range offer {
		best, bestScore := self, score(self, a)
		for node, addrs := range peers {
			if node == self {
				continue
			}
			if _, found := slices.BinarySearchFunc(addrs, a, netip.Addr.Compare); !found {
				continue
			}
			if s := score(node, a); s > bestScore || (s == bestScore && node > best) {
				best, bestScore = node, s
			}
		}
		if best == self {
			mine = append(mine, a)
		}
	}
	return mine
}

// score ranks node for address a: the first 8 bytes of SHA-256 over both
// (FNV, tried first, ranks short names that differ in one byte in the same
// order for every address). It must stay the same in every release, since
// replicas of two releases elect together during an upgrade.
func score(node string, a netip.Addr) uint64 {
	h := sha256.New()
	h.Write([]byte(node))
	h.Write([]byte{0})
	h.Write(a.AsSlice())
	return binary.BigEndian.Uint64(h.Sum(nil))
}
