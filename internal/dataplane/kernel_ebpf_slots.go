package dataplane

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// bpfSlot is what the homes and backends maps hold for one slot of a
// frontend: its home owner, and its backend for each state of that owner
// (has: an entry exists; without one the slot has no backend).
type bpfSlot struct {
	home    uint32
	backend [2]bpfEndpoint
	has     [2]bool
}

// slotsOf is a frontend's slots as its plan says.
func slotsOf(w installedFrontend) []bpfSlot {
	out := make([]bpfSlot, len(w.plan.homes))
	for s, owner := range w.plan.homes {
		out[s].home = owner
		for _, state := range []ownerState{ownerUp, ownerDown} {
			if j := w.plan.entries[state][s]; j >= 0 {
				out[s].backend[state] = bpfEndpointOf(w.set.backends[j].key)
				out[s].has[state] = true
			}
		}
	}
	return out
}

// putSlots writes the homes and backends entries of want's slots that
// have lacks or holds otherwise, and counts them. The slots of each
// frontend are compared as arrays: a sync that changes a few slots costs
// a pass over the slots, and a system call per element changed.
func putSlots(homes, backends *ebpf.Map, have, want map[uint32][]bpfSlot) (int, error) {
	n := 0
	for id, slots := range want {
		old := have[id]
		for s, slot := range slots {
			var was bpfSlot
			if s < len(old) {
				was = old[s]
			}
			for state := range 2 {
				if !slot.has[state] || (was.has[state] && was.backend[state] == slot.backend[state]) {
					continue
				}
				key := bpfBackendKey{Frontend: id, Slot: uint32(s), State: uint32(state)}
				if err := backends.Put(key, slot.backend[state]); err != nil {
					return n, fmt.Errorf("writing a backend of frontend %d: %w", id, err)
				}
				n++
			}
			if s < len(old) && was.home == slot.home {
				continue
			}
			if err := homes.Put(bpfSlotKey{Frontend: id, Slot: uint32(s)}, slot.home); err != nil {
				return n, fmt.Errorf("writing a home of frontend %d: %w", id, err)
			}
			n++
		}
	}
	return n, nil
}

// deleteSlots deletes the homes and backends entries that have holds and
// want does not, and counts them.
func deleteSlots(homes, backends *ebpf.Map, have, want map[uint32][]bpfSlot) (int, error) {
	n := 0
	for id, old := range have {
		slots := want[id]
		for s, was := range old {
			var now bpfSlot
			if s < len(slots) {
				now = slots[s]
			}
			for state := range 2 {
				if was.has[state] && !now.has[state] {
					if err := deleteIfThere(backends, bpfBackendKey{Frontend: id, Slot: uint32(s), State: uint32(state)}); err != nil {
						return n, err
					}
					n++
				}
			}
			if s >= len(slots) {
				if err := deleteIfThere(homes, bpfSlotKey{Frontend: id, Slot: uint32(s)}); err != nil {
					return n, err
				}
				n++
			}
		}
	}
	return n, nil
}

func deleteIfThere(m *ebpf.Map, key any) error {
	if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting an element of %s: %w", m.String(), err)
	}
	return nil
}

// readSlots reads the homes and backends maps into slots, by frontend.
func readSlots(homes, backends *ebpf.Map) (map[uint32][]bpfSlot, error) {
	out := map[uint32][]bpfSlot{}
	at := func(id, s uint32) *bpfSlot {
		for uint32(len(out[id])) <= s {
			out[id] = append(out[id], bpfSlot{})
		}
		return &out[id][s]
	}
	err := eachElement(homes, func(k bpfSlotKey, owner uint32) { at(k.Frontend, k.Slot).home = owner })
	if err != nil {
		return nil, err
	}
	err = eachElement(backends, func(k bpfBackendKey, b bpfEndpoint) {
		if k.State < 2 {
			slot := at(k.Frontend, k.Slot)
			slot.backend[k.State], slot.has[k.State] = b, true
		}
	})
	return out, err
}
