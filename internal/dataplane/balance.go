package dataplane

import (
	"net/netip"
	"sync/atomic"
)

// maglevSize is the Maglev lookup table size: a prime well above the number
// of backends, so each backend's share is even to within about 1%.
const maglevSize = 65537

// backendSet is an immutable view of a frontend's configuration and
// backends. Apply swaps it atomically; every new connection reads it once.
type backendSet struct {
	cfg      Frontend
	backends []*backend // configuration order
	ring     []*backend // weighted round-robin order
	maglev   []uint16   // ClientIP: table index -> backends index
	allow    []netip.Prefix
	next     atomic.Uint64 // round-robin and tie-break cursor
}

func newBackendSet(cfg Frontend, backends []*backend, prev *backendSet) *backendSet {
	s := &backendSet{cfg: cfg, backends: backends, ring: weightedRing(backends)}
	for _, r := range cfg.SourceRanges {
		p, _ := netip.ParsePrefix(r)
		s.allow = append(s.allow, p.Masked())
	}
	if cfg.Balancing == ClientIP {
		if prev != nil && prev.maglev != nil && sameMembers(prev.backends, backends) {
			s.maglev = prev.maglev
		} else {
			s.maglev = buildMaglev(backends)
		}
	}
	if prev != nil {
		s.next.Store(prev.next.Load())
	}
	return s
}

// admits says whether s, a frontend's backends as they are now, still
// takes a client accepted under was: the same Service's frontend (an
// address may pass to another Service between two applies) and its source
// ranges admit it.
func (s *backendSet) admits(was *backendSet, client netip.Addr) bool {
	return s.cfg.Name == was.cfg.Name && s.allowed(client)
}

// allowed reports whether a client address passes the source ranges.
func (s *backendSet) allowed(client netip.Addr) bool {
	if len(s.allow) == 0 {
		return true
	}
	client = client.Unmap()
	for _, p := range s.allow {
		if p.Contains(client) {
			return true
		}
	}
	return false
}

// choose returns the backend for a new connection from client, skipping
// the ones already tried; nil if no backend is eligible.
func (s *backendSet) choose(client netip.Addr, tried []*backend) *backend {
	switch s.cfg.Balancing {
	case LeastConnections:
		return s.leastConnections(tried)
	case ClientIP:
		return s.byClientIP(client, tried)
	default:
		return s.roundRobin(tried)
	}
}

func usable(b *backend, tried []*backend) bool {
	if !b.eligible() {
		return false
	}
	for _, t := range tried {
		if t == b {
			return false
		}
	}
	return true
}

func (s *backendSet) roundRobin(tried []*backend) *backend {
	n := uint64(len(s.ring))
	if n == 0 {
		return nil
	}
	start := s.next.Add(1)
	for i := uint64(0); i < n; i++ {
		if b := s.ring[(start+i)%n]; usable(b, tried) {
			return b
		}
	}
	return nil
}

func (s *backendSet) leastConnections(tried []*backend) *backend {
	n := len(s.backends)
	if n == 0 {
		return nil
	}
	// Start at a rotating offset so ties are shared out.
	start := int(s.next.Add(1) % uint64(n))
	var best *backend
	var bestActive, bestWeight int64
	for i := range n {
		b := s.backends[(start+i)%n]
		if !usable(b, tried) {
			continue
		}
		active, weight := b.active.Load(), int64(b.weight.Load())
		// active/weight < bestActive/bestWeight, without division.
		if best == nil || active*bestWeight < bestActive*weight {
			best, bestActive, bestWeight = b, active, weight
		}
	}
	return best
}

// byClientIP looks the client up in the Maglev table. If that backend is
// not eligible, the client goes to its highest-scoring eligible backend by
// rendezvous hashing: only the clients of an ineligible backend move.
func (s *backendSet) byClientIP(client netip.Addr, tried []*backend) *backend {
	if len(s.backends) == 0 {
		return nil
	}
	h := hashAddr(client.Unmap())
	if b := s.backends[s.maglev[h%maglevSize]]; usable(b, tried) {
		return b
	}
	var best *backend
	var bestScore uint64
	for _, b := range s.backends {
		if !usable(b, tried) {
			continue
		}
		if score := mix(h ^ hashAddrPort(b.key)); best == nil || score > bestScore {
			best, bestScore = b, score
		}
	}
	return best
}

// weightedRing interleaves the backends, each appearing weight times, so
// that round robin spreads a heavy backend's turns evenly.
func weightedRing(backends []*backend) []*backend {
	maxW := int32(0)
	for _, b := range backends {
		maxW = max(maxW, b.weight.Load())
	}
	var ring []*backend
	for round := int32(0); round < maxW; round++ {
		for _, b := range backends {
			if b.weight.Load() > round {
				ring = append(ring, b)
			}
		}
	}
	return ring
}

func sameMembers(a, b []*backend) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].key != b[i].key || a[i].weight.Load() != b[i].weight.Load() {
			return false
		}
	}
	return true
}

// buildMaglev fills the Maglev lookup table (Eisenbud et al., NSDI 2016):
// each backend walks its own permutation of the table, taking free slots in
// turn (weight slots per turn). It depends only on the backends' addresses
// and weights, so every replica builds the same table.
func buildMaglev(backends []*backend) []uint16 {
	if len(backends) == 0 {
		return nil
	}
	n := len(backends)
	offset, skip, next := make([]uint64, n), make([]uint64, n), make([]uint64, n)
	for i, b := range backends {
		h := hashAddrPort(b.key)
		offset[i] = h % maglevSize
		skip[i] = mix(h)%(maglevSize-1) + 1
	}
	table := make([]uint16, maglevSize)
	filled := make([]bool, maglevSize)
	for count := 0; ; {
		for i, b := range backends {
			for range b.weight.Load() {
				slot := (offset[i] + next[i]*skip[i]) % maglevSize
				for filled[slot] {
					next[i]++
					slot = (offset[i] + next[i]*skip[i]) % maglevSize
				}
				table[slot], filled[slot] = uint16(i), true
				next[i]++
				if count++; count == maglevSize {
					return table
				}
			}
		}
	}
}

// FNV-1a over an address, and a finaliser to spread it: stable across
// processes, unlike maphash, so that replicas agree.
func hashAddr(a netip.Addr) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range a.As16() {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return mix(h)
}

func hashAddrPort(ap netip.AddrPort) uint64 {
	return mix(hashAddr(ap.Addr()) ^ uint64(ap.Port()))
}

// mix is splitmix64's finaliser.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
