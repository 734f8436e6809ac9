package dataplane

import (
	"fmt"
	"time"

	"github.com/google/nftables"
)

// slotState is what a kernel path's selection maps hold, as the slot
// plan sees it, and whether its entries are prepared for owners' next
// changes. Both paths keep one, and share the fast path of an owner's
// admin-state change (planFlip, recordFlip).
type slotState struct {
	// installed is, for each kernel frontend, the backend set its
	// entries were built from, its table and index there, the
	// eligibility they were planned by, and its slots; nil when unknown.
	installed map[*frontend]installedFrontend
	// owners is each table's owners.
	owners map[nftables.TableFamily]ownerTable
	// preparedAll: the installed entries are prepared for every owner's
	// next change; preparedOwner: for that owner's only (the one that
	// changed last, on the fast path).
	preparedAll   bool
	preparedOwner string
}

// planFlip says whether one owner's admin-state change can go on the
// fast path, when the installed entries were prepared for it (by a sync
// that prepared them all, or by this owner's previous change on this
// path): the owner's state in the owners map is then the whole change,
// and nothing is planned or allocated. changed is the owner's new state
// in each table where it changes. It reports false when that does not
// hold (the structure changed, another backend's eligibility changed, the
// entries were not prepared, or another node's slots would move: their
// heir is on this node, or another node is out while this one comes
// back); a sync then does the change. frontends are the kernel frontends.
func (s *slotState) planFlip(frontends []*frontend, owner string) (changed map[nftables.TableFamily]ownerState, ok bool) {
	prepared := s.preparedAll || (owner != "" && s.preparedOwner == owner)
	if s.installed == nil || !prepared || len(frontends) != len(s.installed) {
		return nil, false
	}
	// The owner's new state in each table: down when any of its
	// backends is admin Down.
	down := map[nftables.TableFamily]bool{}
	for _, f := range frontends {
		w, ok := s.installed[f]
		if !ok || f.set.Load() != w.set {
			return nil, false
		}
		for _, b := range w.set.backends {
			if b.owner == owner {
				down[w.family] = down[w.family] || adminState(b.admin.Load()) == adminDown
			}
		}
	}
	changed = map[nftables.TableFamily]ownerState{}
	for fam, isDown := range down {
		state := ownerUp
		if isDown {
			state = ownerDown
		}
		if s.owners[fam].state[s.owners[fam].ids[owner]] != state {
			changed[fam] = state
		}
	}
	for _, f := range frontends {
		w := s.installed[f]
		state, flips := changed[w.family]
		for j, b := range w.set.backends {
			now := b.eligible()
			switch {
			// The other backends as when the entries were made.
			case b.owner != owner:
				if now != w.elig.now[j] {
					return nil, false
				}
			// The owner's: all out (going Down), back as prepared (coming
			// back), or, with no change of state, as installed.
			case flips && state == ownerDown && now,
				flips && state == ownerUp && now != w.elig.back[j],
				!flips && now != w.elig.now[j]:
				return nil, false
			}
		}
		if flips && !flipsAlone(w, s.owners[w.family], owner, state) {
			return nil, false
		}
	}
	return changed, true
}

// recordFlip records the change planFlip planned, once the path has
// installed it: the owner's states, and its backends' eligibility.
func (s *slotState) recordFlip(frontends []*frontend, owner string, changed map[nftables.TableFamily]ownerState) {
	if len(changed) > 0 {
		for fam, state := range changed {
			s.owners[fam].state[s.owners[fam].ids[owner]] = state
		}
		// The other nodes' prepared entries may have their heirs on
		// this one: they are prepared again later. This one's stay
		// valid (the others are as they were), so it can change back.
		s.preparedAll, s.preparedOwner = false, owner
	}
	// The owner's backends are now what planFlip found.
	for _, f := range frontends {
		w := s.installed[f]
		state, flips := changed[w.family]
		for j, b := range w.set.backends {
			if b.owner == owner && flips {
				w.elig.now[j] = state == ownerUp && w.elig.back[j]
				b.inKernel.Store(w.elig.now[j])
			}
		}
	}
}

// flipOwner is the nftables path's fast path for one owner's admin-state
// change (see planFlip): one element of the owners map, per table where
// the owner's state changes, in one transaction.
func (k *kernelEngine) flipOwner(frontends []*frontend, owner string, m *metrics) (bool, error) {
	start := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	changed, ok := k.planFlip(frontends, owner)
	if !ok {
		return false, nil
	}
	if len(changed) > 0 {
		c, err := k.connect()
		if err != nil {
			return false, err
		}
		for fam, state := range changed {
			_, ownersMap, _ := kernelMaps(&nftables.Table{Name: k.table, Family: fam}, familyOfTable(fam))
			id := k.owners[fam].ids[owner]
			err = c.SetDeleteElements(ownersMap, []nftables.SetElement{{Key: u32(id)}})
			if err == nil {
				err = c.SetAddElements(ownersMap, []nftables.SetElement{ownerElement(id, state)})
			}
			if err != nil {
				// Nothing half-built may go with the sync that follows:
				// a new connection, and the tables rebuilt.
				k.forget()
				return false, fmt.Errorf("changing %s in the owners map: %w", owner, err)
			}
		}
		if err := c.Flush(); err != nil {
			m.kernelFailures.Inc()
			k.forget()
			return false, fmt.Errorf("installing the nftables tables %s: %w", k.table, err)
		}
	}
	k.recordFlip(frontends, owner, changed)
	m.kernelSyncs.WithLabelValues("owners").Observe(time.Since(start).Seconds())
	return true, nil
}

// flipsAlone reports whether owner's going to state moves no slot but its
// own home slots, whose prepared entries are exact. Going Down, no other
// slot may be on owner's backends (an heir there); coming back, every
// other slot must be on its home (an heir elsewhere might return to owner).
func flipsAlone(w installedFrontend, owners ownerTable, owner string, state ownerState) bool {
	id := owners.ids[owner]
	for s, home := range w.plan.homes {
		if home == id {
			continue
		}
		in := w.plan.entries[owners.state[home]][s]
		switch {
		case state == ownerDown && in >= 0 && w.set.backends[in].owner == owner:
			return false
		case state == ownerUp && int(in) != w.plan.home[s]:
			return false
		}
	}
	return true
}

// backAs is the admin state a backend would have if its owner came back:
// Down as None, others as they are.
func backAs(admin adminState) adminState {
	if admin == adminDown {
		return adminNone
	}
	return admin
}
