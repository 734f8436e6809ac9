package dataplane

import (
	"bytes"
	"errors"
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

// bpfMaxOwners is the size of the owners map.
const bpfMaxOwners = 65536

// bpfContents is what the selection maps hold. A frontend of ID 0 is one
// that was removed and still has flows: it takes no new flow, and the
// sweeper deletes it when its last flow is gone.
type bpfContents struct {
	frontends map[bpfFrontendKey]bpfFrontend
	homes     map[bpfSlotKey]uint32
	backends  map[bpfBackendKey]bpfEndpoint
	ranges    map[bpfRangeKey]uint32
	// owners is each owner id's state; ownerNames its name.
	owners     map[uint32]uint32
	ownerNames map[uint32]string
}

func newBPFContents() *bpfContents {
	return &bpfContents{
		frontends: map[bpfFrontendKey]bpfFrontend{}, homes: map[bpfSlotKey]uint32{},
		backends: map[bpfBackendKey]bpfEndpoint{}, ranges: map[bpfRangeKey]uint32{},
		owners: map[uint32]uint32{}, ownerNames: map[uint32]string{},
	}
}

// sameButOwners reports whether want differs from c in owners' states
// only (or not at all).
func (c *bpfContents) sameButOwners(want *bpfContents) bool {
	return c != nil && maps.Equal(c.frontends, want.frontends) && maps.Equal(c.homes, want.homes) &&
		maps.Equal(c.backends, want.backends) && maps.Equal(c.ranges, want.ranges) && maps.Equal(c.ownerNames, want.ownerNames)
}

func bpfFrontendKeyOf(k frontendKey) bpfFrontendKey {
	a, _ := ebpfAddr(k.addr.Addr())
	return bpfFrontendKey{Addr: a, Port: bigEndianPort(k.addr.Port()), Proto: 6} // IPPROTO_TCP
}

func bpfEndpointOf(ap netip.AddrPort) bpfEndpoint {
	a, _ := ebpfAddr(ap.Addr())
	return bpfEndpoint{Addr: a, Port: bigEndianPort(ap.Port())}
}

// plan computes what the maps should hold for frontends. Frontends and
// owners keep the ids the maps gave them (so that a change rewrites only
// what changed, and a restart nothing); new ones take the lowest free
// ids. The slots are the nftables path's (kernel_slots.go), with the
// entries of both states of each slot's home owner exact.
func (e *ebpfPath) plan(frontends []*frontend) *bpfContents {
	have := e.installed
	want := newBPFContents()
	slices.SortFunc(frontends, func(a, b *frontend) int { return compareNames(a, b) })

	owners := ownerTable{ids: map[string]uint32{}}
	ownerIDs := freeIDs{used: map[uint32]bool{}}
	known := map[string]uint32{}
	for id, name := range have.ownerNames {
		known[name] = id
	}
	down := map[string]bool{}
	var names []string
	for _, f := range frontends {
		for _, b := range f.set.Load().backends {
			if _, seen := down[b.owner]; !seen {
				names = append(names, b.owner)
			}
			down[b.owner] = down[b.owner] || adminState(b.admin.Load()) == adminDown
		}
	}
	slices.Sort(names)
	for _, name := range names {
		if id, ok := known[name]; ok {
			owners.ids[name] = id
			ownerIDs.used[id] = true
		}
	}
	for _, name := range names {
		if _, ok := owners.ids[name]; !ok {
			owners.ids[name] = ownerIDs.next()
		}
	}
	owners.state = make([]ownerState, ownerIDs.max()+1)
	for name, id := range owners.ids {
		if down[name] {
			owners.state[id] = ownerDown
		}
		want.owners[id] = uint32(owners.state[id])
		want.ownerNames[id] = name
	}

	frontendIDs := freeIDs{used: map[uint32]bool{}}
	keys := make([]bpfFrontendKey, len(frontends))
	for i, f := range frontends {
		keys[i] = bpfFrontendKeyOf(f.key)
	}
	// The ids of frontends removed now are not given to new ones before
	// the next sync: until the removed ones' entries change, new flows to
	// them may still look up their old id's slots.
	for _, fe := range have.frontends {
		if fe.ID != 0 {
			frontendIDs.used[fe.ID] = true
		}
	}
	idle := map[bpfFrontendKey]time.Duration{}
	for i, f := range frontends {
		set := f.set.Load()
		id := have.frontends[keys[i]].ID
		if id == 0 {
			id = frontendIDs.next()
		}
		plan := planSlots(set, owners, eligibilityOf(set), nil, true)
		fe := bpfFrontend{ID: id, Slots: uint32(len(plan.homes))}
		if set.cfg.Balancing == ClientIP {
			fe.Flags |= bpfFrontendClientIP
		}
		for s, owner := range plan.homes {
			want.homes[bpfSlotKey{Frontend: id, Slot: uint32(s)}] = owner
			for _, state := range []ownerState{ownerUp, ownerDown} {
				if j := plan.entries[state][s]; j >= 0 {
					want.backends[bpfBackendKey{Frontend: id, Slot: uint32(s), State: uint32(state)}] = bpfEndpointOf(set.backends[j].key)
				}
			}
		}
		for _, r := range set.cfg.SourceRanges {
			p, err := netip.ParsePrefix(r)
			if err != nil || !p.Addr().Is4() {
				continue // validated; a range of the other family lets nobody in
			}
			fe.Flags |= bpfFrontendRanges
			want.ranges[bpfRangeKey{Prefixlen: 32 + uint32(p.Bits()), Frontend: id, Addr: p.Masked().Addr().As4()}] = 1
		}
		want.frontends[keys[i]] = fe
		idle[keys[i]] = set.cfg.IdleTimeout.Duration
	}
	// Removed frontends stay, taking no new flow, until their flows end.
	for k := range have.frontends {
		if _, ok := want.frontends[k]; !ok {
			want.frontends[k] = bpfFrontend{}
		}
	}
	e.idle = idle
	return want
}

func compareNames(a, b *frontend) int {
	an, bn := a.set.Load().cfg.Name, b.set.Load().cfg.Name
	switch {
	case an < bn:
		return -1
	case an > bn:
		return 1
	}
	return 0
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

// write brings the maps from e.installed to want in an order that keeps
// every new flow's lookups consistent: first what nothing points to yet
// (new owners, slots' backends and homes, source ranges), then the
// frontends that point to them, then owners' states (an admin-state
// change: the entries of the new state are in place by then), and last
// the deletion of what nothing points to any more.
func (e *ebpfPath) write(want *bpfContents) error {
	have := e.installed
	m := e.coll.Maps
	for id, name := range want.ownerNames {
		if _, ok := have.ownerNames[id]; ok {
			continue
		}
		var n bpfOwnerName
		copy(n.Name[:], name)
		if err := m["owner_names"].Put(id, n); err != nil {
			return fmt.Errorf("naming owner %s: %w", name, err)
		}
		if err := m["owners"].Put(id, want.owners[id]); err != nil {
			return fmt.Errorf("setting owner %s's state: %w", name, err)
		}
	}
	if err := putChanged(m["backends"], have.backends, want.backends); err != nil {
		return err
	}
	if err := putChanged(m["homes"], have.homes, want.homes); err != nil {
		return err
	}
	if err := putChanged(m["ranges"], have.ranges, want.ranges); err != nil {
		return err
	}
	if err := putChanged(m["frontends"], have.frontends, want.frontends); err != nil {
		return err
	}
	if err := putChanged(m["owners"], have.owners, want.owners); err != nil {
		return err
	}
	for _, del := range []error{
		deleteGone(m["ranges"], have.ranges, want.ranges),
		deleteGone(m["homes"], have.homes, want.homes),
		deleteGone(m["backends"], have.backends, want.backends),
		deleteGone(m["owner_names"], have.ownerNames, want.ownerNames),
	} {
		if del != nil {
			return del
		}
	}
	return nil
}

// putChanged writes the elements of want that have lacks or holds
// otherwise.
func putChanged[K, V comparable](m *ebpf.Map, have, want map[K]V) error {
	for k, v := range want {
		if old, ok := have[k]; ok && old == v {
			continue
		}
		if err := m.Put(k, v); err != nil {
			return fmt.Errorf("writing an element of %s: %w", m.String(), err)
		}
	}
	return nil
}

// deleteGone deletes the elements of have that want lacks.
func deleteGone[K, V comparable](m *ebpf.Map, have, want map[K]V) error {
	for k := range have {
		if _, ok := want[k]; ok {
			continue
		}
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting an element of %s: %w", m.String(), err)
		}
	}
	return nil
}

// readContents reads the selection maps as they are: empty after a
// fresh load, a predecessor's after a restart.
func readContents(coll *ebpf.Collection) (*bpfContents, error) {
	c := newBPFContents()
	m := coll.Maps
	if err := readAll(m["frontends"], c.frontends); err != nil {
		return nil, err
	}
	if err := readAll(m["homes"], c.homes); err != nil {
		return nil, err
	}
	if err := readAll(m["backends"], c.backends); err != nil {
		return nil, err
	}
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
