package dataplane

import "sync"

// ownerAdmin is the node fast path's state: the admin state
// SetOwnerAdminState last set for each owner, which wins over the
// configuration's in every later Apply, and the frontends of the last
// Apply, whose backends it changes. Its lock is held only while admin
// states are written (by Apply, frontend by frontend, and by the fast
// path), never across an Apply's sockets, probes or kernel sync: a node
// that starts leaving does not wait for a resync.
type ownerAdmin struct {
	mu        sync.Mutex
	states    map[string]adminState
	frontends []*frontend
}

// stateOf is the admin state backend b takes: the fast path's for its
// owner, if it set one, else the configuration's. mu is held.
func (o *ownerAdmin) stateOf(b Backend) adminState {
	if s, ok := o.states[b.Owner]; ok && b.Owner != "" {
		return s
	}
	return toAdminState(b.AdminState)
}

// set gives owner's backends state, in every frontend, and remembers it
// for later Applies. It returns how many backends it set and whether any
// is served by the kernel engine (whose tables the caller brings along).
func (o *ownerAdmin) set(owner string, state adminState) (n int, kernel bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.states == nil {
		o.states = map[string]adminState{}
	}
	o.states[owner] = state
	for _, f := range o.frontends {
		for _, b := range f.set.Load().backends {
			if b.owner == owner {
				b.setAdminState(state)
				n++
				kernel = kernel || f.kernel
			}
		}
	}
	return n, kernel
}
