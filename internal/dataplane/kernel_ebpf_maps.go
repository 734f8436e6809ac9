package dataplane

import (
	"bytes"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
)

// The program's map keys and values (bpf/ebb_lb.c), field for field.
// Addresses and ports are in network order, as the packets carry them.
type (
	bpfEndpoint struct {
		Addr [4]byte
		Port [2]byte
		Pad  uint16
	}
	bpfFrontendKey struct {
		Addr  [4]byte
		Port  [2]byte
		Proto uint16
	}
	bpfFrontend struct {
		ID, Slots, Flags, Pad uint32
	}
	bpfSlotKey struct {
		Frontend, Slot uint32
	}
	bpfBackendKey struct {
		Frontend, Slot, State, Pad uint32
	}
	bpfRangeKey struct {
		Prefixlen uint32
		Frontend  uint32
		Addr      [4]byte
	}
	bpfOwnerName struct {
		Name [256]byte
	}
)

// The frontend flags of the program.
const (
	bpfFrontendClientIP = 1
	bpfFrontendRanges   = 2
)

// The sizes of the frontends and owners maps.
const (
	bpfMaxFrontends = 4096
	bpfMaxOwners    = 65536
)

// bpfContents is what the selection maps hold. A frontend of ID 0 is one
// that was removed and still has flows: it takes no new flow, and the
// sweeper deletes it when its last flow is gone.
type bpfContents struct {
	frontends map[bpfFrontendKey]bpfFrontend
	// slots is each frontend's slots, by frontend id: the homes and
	// backends maps.
	slots  map[uint32][]bpfSlot
	ranges map[bpfRangeKey]uint32
	// owners is each owner id's state; ownerNames its name.
	owners     map[uint32]uint32
	ownerNames map[uint32]string
}

// newBPFContents is empty contents with room for as many elements as
// like holds (nil: none).
func newBPFContents(like *bpfContents) *bpfContents {
	if like == nil {
		like = &bpfContents{}
	}
	return &bpfContents{
		frontends: make(map[bpfFrontendKey]bpfFrontend, len(like.frontends)), slots: make(map[uint32][]bpfSlot, len(like.slots)),
		ranges: make(map[bpfRangeKey]uint32, len(like.ranges)),
		owners: make(map[uint32]uint32, len(like.owners)), ownerNames: make(map[uint32]string, len(like.ownerNames)),
	}
}

func bpfFrontendKeyOf(k frontendKey) bpfFrontendKey {
	return bpfFrontendKey{Addr: addr4(k.addr.Addr()), Port: bigEndianPort(k.addr.Port()), Proto: 6} // IPPROTO_TCP
}

func bpfEndpointOf(ap netip.AddrPort) bpfEndpoint {
	return bpfEndpoint{Addr: addr4(ap.Addr()), Port: bigEndianPort(ap.Port())}
}

// ownerTable is the owners of the frontends' backends and their states
// (newOwnerTable's), with the ids the maps gave them (so that a change
// rewrites only what changed, and a restart nothing); new ones take the
// lowest free ids. The ids of owners gone now are not given to new ones
// before the next sync: until their slots' homes are rewritten, new flows
// may still look them up.
func (e *ebpfPath) ownerTable(frontends []*frontend) (ownerTable, error) {
	sets := make([]*backendSet, len(frontends))
	for i, f := range frontends {
		sets[i] = f.set.Load()
	}
	byName := newOwnerTable(sets)
	ids := freeIDs{used: map[uint32]bool{}}
	known := make(map[string]uint32, len(e.contents.ownerNames))
	for id, name := range e.contents.ownerNames {
		known[name] = id
		ids.used[id] = true
	}
	owners := ownerTable{ids: make(map[string]uint32, len(byName.ids))}
	for _, name := range slices.Sorted(maps.Keys(byName.ids)) {
		id, ok := known[name]
		if !ok {
			id = ids.next()
		}
		owners.ids[name] = id
	}
	if ids.max() >= bpfMaxOwners {
		return owners, fmt.Errorf("%d nodes own backends: the eBPF kernel path holds %d at most", len(owners.ids), bpfMaxOwners-1)
	}
	owners.state = make([]ownerState, ids.max()+1)
	for name, id := range owners.ids {
		owners.state[id] = byName.state[byName.ids[name]]
	}
	return owners, nil
}

// frontendIDs gives each frontend the id the maps gave it, or the lowest
// free one. The ids of frontends removed now are not given to new ones
// before the next sync: until the removed ones' entries change, new flows
// to them may still look up their old id's slots.
func (e *ebpfPath) frontendIDs(frontends []*frontend) (map[*frontend]uint32, error) {
	ids := freeIDs{used: map[uint32]bool{}}
	for _, fe := range e.contents.frontends {
		if fe.ID != 0 {
			ids.used[fe.ID] = true
		}
	}
	slices.SortFunc(frontends, compareNames)
	out := make(map[*frontend]uint32, len(frontends))
	for _, f := range frontends {
		id := e.contents.frontends[bpfFrontendKeyOf(f.key)].ID
		if id == 0 {
			id = ids.next()
		}
		out[f] = id
	}
	if ids.max() >= bpfMaxFrontends {
		return nil, fmt.Errorf("%d frontends: the eBPF kernel path holds %d at most", len(frontends), bpfMaxFrontends-1)
	}
	return out, nil
}

// render is what the maps hold for the planned frontends (their index is
// their id) and owners: the entries of both states of each slot's home
// owner, as planned. Removed frontends stay, taking no new flow, until
// their flows end.
func (e *ebpfPath) render(want map[*frontend]installedFrontend, owners ownerTable) *bpfContents {
	c := newBPFContents(e.contents)
	for name, id := range owners.ids {
		c.owners[id] = uint32(owners.state[id])
		c.ownerNames[id] = name
	}
	idle := map[bpfFrontendKey]time.Duration{}
	for f, w := range want {
		id := uint32(w.index)
		fe := bpfFrontend{ID: id, Slots: uint32(len(w.plan.homes))}
		if w.set.cfg.Balancing == ClientIP {
			fe.Flags |= bpfFrontendClientIP
		}
		if len(w.plan.homes) > 0 {
			c.slots[id] = slotsOf(w)
		}
		if len(w.set.cfg.SourceRanges) > 0 {
			// Set by the ranges given, not by those of the frontend's
			// family: ranges of the other family only let nobody in, as on
			// the other engines (the program then finds no range to match).
			fe.Flags |= bpfFrontendRanges
		}
		for _, r := range w.set.cfg.SourceRanges {
			p, err := netip.ParsePrefix(r)
			if err != nil || !p.Addr().Is4() {
				continue // validated; a range of the other family matches no IPv4 client
			}
			c.ranges[bpfRangeKey{Prefixlen: 32 + uint32(p.Bits()), Frontend: id, Addr: p.Masked().Addr().As4()}] = 1
		}
		key := bpfFrontendKeyOf(f.key)
		c.frontends[key] = fe
		idle[key] = w.set.cfg.IdleTimeout.Duration
	}
	for k := range e.contents.frontends {
		if _, ok := c.frontends[k]; !ok {
			c.frontends[k] = bpfFrontend{}
		}
	}
	e.idle.Store(&idle)
	return c
}

// freeIDs hands out the lowest ids from 1 that are not used.
type freeIDs struct {
	used map[uint32]bool
	last uint32
}

func (f *freeIDs) next() uint32 {
	for f.last++; f.used[f.last]; f.last++ {
	}
	f.used[f.last] = true
	return f.last
}

func (f *freeIDs) max() uint32 {
	var m uint32
	for id := range f.used {
		m = max(m, id)
	}
	return m
}

// write brings the maps from e.contents to want in an order that keeps
// every new flow's lookups consistent: first what nothing points to yet
// (new owners, slots' backends and homes, source ranges), then the
// frontends that point to them, then owners' states (an admin-state
// change: the entries of the new state are in place by then), and last
// the deletion of what nothing points to any more. It counts the
// elements it changed but owners' states.
func (e *ebpfPath) write(want *bpfContents) (int, error) {
	have := e.contents
	m := e.coll.Maps
	changed := 0
	for id, name := range want.ownerNames {
		if _, ok := have.ownerNames[id]; ok {
			continue
		}
		var n bpfOwnerName
		copy(n.Name[:], name)
		if err := m["owner_names"].Put(id, n); err != nil {
			return changed, fmt.Errorf("naming owner %s: %w", name, err)
		}
		if err := m["owners"].Put(id, want.owners[id]); err != nil {
			return changed, fmt.Errorf("setting owner %s's state: %w", name, err)
		}
		changed++
	}
	steps := []func() (int, error){
		func() (int, error) { return putSlots(m["homes"], m["backends"], have.slots, want.slots) },
		func() (int, error) { return putChanged(m["ranges"], have.ranges, want.ranges) },
		func() (int, error) { return putChanged(m["frontends"], have.frontends, want.frontends) },
		func() (int, error) {
			_, err := putChanged(m["owners"], have.owners, want.owners)
			return 0, err
		},
		func() (int, error) { return deleteGone(m["ranges"], have.ranges, want.ranges) },
		func() (int, error) { return deleteSlots(m["homes"], m["backends"], have.slots, want.slots) },
		func() (int, error) { return deleteGone(m["owner_names"], have.ownerNames, want.ownerNames) },
	}
	for _, step := range steps {
		n, err := step()
		changed += n
		if err != nil {
			return changed, err
		}
	}
	return changed, nil
}

// putChanged writes the elements of want that have lacks or holds
// otherwise, and counts them.
func putChanged[K, V comparable](m *ebpf.Map, have, want map[K]V) (int, error) {
	n := 0
	for k, v := range want {
		if old, ok := have[k]; ok && old == v {
			continue
		}
		if err := m.Put(k, v); err != nil {
			return n, fmt.Errorf("writing an element of %s: %w", m.String(), err)
		}
		n++
	}
	return n, nil
}

// deleteGone deletes the elements of have that want lacks, and counts
// them.
func deleteGone[K, V comparable](m *ebpf.Map, have, want map[K]V) (int, error) {
	n := 0
	for k := range have {
		if _, ok := want[k]; ok {
			continue
		}
		if err := deleteIfThere(m, k); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// readContents reads the selection maps as they are: empty after a
// fresh load, a predecessor's after a restart.
func readContents(coll *ebpf.Collection) (*bpfContents, error) {
	c := newBPFContents(nil)
	m := coll.Maps
	if err := readAll(m["frontends"], c.frontends); err != nil {
		return nil, err
	}
	slots, err := readSlots(m["homes"], m["backends"])
	if err != nil {
		return nil, err
	}
	c.slots = slots
	if err := readAll(m["ranges"], c.ranges); err != nil {
		return nil, err
	}
	names := map[uint32]bpfOwnerName{}
	if err := readAll(m["owner_names"], names); err != nil {
		return nil, err
	}
	for id, n := range names {
		c.ownerNames[id] = string(bytes.TrimRight(n.Name[:], "\x00"))
		var state uint32
		if err := m["owners"].Lookup(id, &state); err != nil {
			return nil, fmt.Errorf("reading owner %d's state: %w", id, err)
		}
		c.owners[id] = state
	}
	return c, nil
}

func readAll[K, V comparable](m *ebpf.Map, into map[K]V) error {
	if m.Type() == ebpf.Array || m.Type() == ebpf.LPMTrie {
		var k K
		var v V
		it := m.Iterate()
		for it.Next(&k, &v) {
			into[k] = v
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("reading %s: %w", m.String(), err)
		}
		return nil
	}
	return eachElement(m, func(k K, v V) { into[k] = v })
}
