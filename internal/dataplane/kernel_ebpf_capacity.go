package dataplane

import (
	"fmt"
	"net/netip"
	"slices"
)

// bpfRoom is how many more elements each of the eBPF path's bounded maps
// takes (their sizes are bpf/ebb_lb.c's MAX_* constants, read from the
// loaded maps).
type bpfRoom struct {
	// maxFrontends is the most frontends the path serves.
	maxFrontends int
	// ids are the frontend ids left: ids are 1 to the frontends map's
	// size - 1, and a frontend removed now keeps its id until the next
	// sync (frontendIDs).
	ids int
	// frontends, homes, backends and ranges are elements left in the
	// maps of those names.
	frontends, homes, backends, ranges int
}

// bpfNeed is what one frontend adds to the maps in a sync.
type bpfNeed struct {
	id, frontends, homes, backends, ranges int
}

// fit picks the frontends the maps have room for, and refuses the rest
// with the reason. A sync writes what is new before it deletes what is
// gone (write), so the room is counted with everything the maps hold now
// still in them: a frontend refused for that may fit at the next sync.
// The frontends installed now come first, so that they keep being served;
// then the others by name. Before, one write that failed for want of room
// took every kernel frontend out, sync after sync.
func (e *ebpfPath) fit(frontends []*frontend) ([]*frontend, map[*frontend]string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.load(); err != nil {
		return nil, nil, err
	}
	room := e.room()
	have := e.contents
	ordered := slices.Clone(frontends)
	slices.SortFunc(ordered, func(a, b *frontend) int {
		_, ia := have.frontends[bpfFrontendKeyOf(a.key)]
		_, ib := have.frontends[bpfFrontendKeyOf(b.key)]
		if ia != ib {
			if ia {
				return -1
			}
			return 1
		}
		return compareNames(a, b)
	})
	var fits []*frontend
	var full map[*frontend]string
	for _, f := range ordered {
		need := e.need(f)
		if why := room.lacks(need); why != "" {
			if full == nil {
				full = map[*frontend]string{}
			}
			full[f] = why
			continue
		}
		room.take(need)
		fits = append(fits, f)
	}
	return fits, full, nil
}

// room is what the maps take beyond what they hold now. e.mu is held and
// the maps are loaded.
func (e *ebpfPath) room() bpfRoom {
	m, have := e.coll.Maps, e.contents
	if e.capacity != nil {
		m = nil
	}
	size := func(name string) int {
		if m == nil {
			return e.capacity[name]
		}
		return int(m[name].MaxEntries())
	}
	live := 0
	for _, fe := range have.frontends {
		if fe.ID != 0 {
			live++
		}
	}
	homes, backends := slotElements(have.slots)
	return bpfRoom{
		maxFrontends: size("frontends") - 1,
		ids:          size("frontends") - 1 - live,
		frontends:    size("frontends") - len(have.frontends),
		homes:        size("homes") - homes,
		backends:     size("backends") - backends,
		ranges:       size("ranges") - len(have.ranges),
	}
}

// need is what f adds to the maps: for a frontend installed now, the
// slots and ranges beyond those it has; for a new one, an id, its key and
// all of them (each slot has a home and up to a backend per state of its
// home owner).
func (e *ebpfPath) need(f *frontend) bpfNeed {
	set := f.set.Load()
	slots := slotCount(set)
	var ranges []netip.Prefix
	for _, r := range set.cfg.SourceRanges {
		if p, err := netip.ParsePrefix(r); err == nil && p.Addr().Is4() {
			ranges = append(ranges, p.Masked())
		}
	}
	have := e.contents
	fe, installed := have.frontends[bpfFrontendKeyOf(f.key)]
	if !installed || fe.ID == 0 {
		n := bpfNeed{id: 1, homes: slots, backends: 2 * slots, ranges: len(ranges)}
		if !installed {
			n.frontends = 1
		}
		return n
	}
	oldHomes, oldBackends := slotElements(map[uint32][]bpfSlot{fe.ID: have.slots[fe.ID]})
	n := bpfNeed{homes: max(0, slots-oldHomes), backends: max(0, 2*slots-oldBackends)}
	for _, p := range ranges {
		if _, ok := have.ranges[bpfRangeKey{Prefixlen: 32 + uint32(p.Bits()), Frontend: fe.ID, Addr: p.Addr().As4()}]; !ok {
			n.ranges++
		}
	}
	return n
}

// slotElements counts the elements of the homes map (one per slot) and
// of the backends map (one per state of a slot's home owner that has a
// backend) that slots take.
func slotElements(slots map[uint32][]bpfSlot) (homes, backends int) {
	for _, ss := range slots {
		homes += len(ss)
		for _, s := range ss {
			for _, has := range s.has {
				if has {
					backends++
				}
			}
		}
	}
	return homes, backends
}

// lacks says which map has no room for need, or "".
func (r bpfRoom) lacks(need bpfNeed) string {
	const advice = "serve fewer Service ports, or fewer nodes, on this path, or use the nftables kernel path (ebb lb --kernel-path=nftables) or the proxy engine"
	switch {
	case need.id > r.ids || need.frontends > r.frontends:
		return fmt.Sprintf("the eBPF kernel path's frontends map is full (%d frontends at most, counting those removed a moment ago): %s", r.maxFrontends, advice)
	case need.homes > r.homes || need.backends > r.backends:
		// The room left is not in the message: it moves with every
		// other frontend, and each new message is a new event
		// (ebb_dataplane_bpf_map_elements has it).
		return fmt.Sprintf("the eBPF kernel path's slot maps are full: this frontend needs %d more elements of the backends map and %d of the homes map than are left: %s", need.backends, need.homes, advice)
	case need.ranges > r.ranges:
		return fmt.Sprintf("the eBPF kernel path's source ranges map is full: this frontend needs %d more ranges than are left: %s", need.ranges, advice)
	}
	return ""
}

func (r *bpfRoom) take(need bpfNeed) {
	r.ids -= need.id
	r.frontends -= need.frontends
	r.homes -= need.homes
	r.backends -= need.backends
	r.ranges -= need.ranges
}

// observeMaps publishes how full the bounded maps are. e.mu is held.
func (e *ebpfPath) observeMaps(m *metrics) {
	homes, backends := slotElements(e.contents.slots)
	for name, n := range map[string]int{"frontends": len(e.contents.frontends), "homes": homes, "backends": backends,
		"ranges": len(e.contents.ranges), "owners": len(e.contents.ownerNames)} {
		m.bpfElements.WithLabelValues(name).Set(float64(n))
		if mp := e.coll.Maps[name]; mp != nil {
			m.bpfSize.WithLabelValues(name).Set(float64(mp.MaxEntries()))
		}
	}
}
