package dataplane

import "sync"

// ownerAdmin is the node fast path's state: the admin state
// SetOwnerAdminState last set for each owner, which wins over the
// configuration's in every later Apply, and the frontends being served,
// whose backends it changes. Its lock is held only while admin states are
// written (by Apply, over its loop that builds the frontends' backend
// sets, and by the fast path) and the list is replaced, never across an
// Apply's sockets, probes or kernel sync: a node that starts leaving does
// not wait for a resync.
type ownerAdmin struct {
	mu     sync.Mutex
	states map[string]adminState
	// frontends are the data plane's frontends, published by whatever
	// adds or removes them (publishFrontendsLocked).
	frontends []*frontend

	// flipMu serialises the kernel engine's fast path run outside the
	// data plane's lock (flipKernel) with HandOver and Close, which set
	// retired: from then on the tables are a successor's, or nobody's to
	// change.
	flipMu  sync.Mutex
	retired bool
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

// publishFrontendsLocked publishes the data plane's frontends to the fast
// path, after frontends were removed (a kernel path without room, or
// failing; Close). d.mu is held.
func (d *DataPlane) publishFrontendsLocked() {
	out := make([]*frontend, 0, len(d.frontends))
	for _, f := range d.frontends {
		out = append(out, f)
	}
	d.owners.mu.Lock()
	d.owners.frontends = out
	d.owners.mu.Unlock()
}

// kernelFrontends are the kernel engine's frontends being served.
func (o *ownerAdmin) kernelFrontends() []*frontend {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []*frontend
	for _, f := range o.frontends {
		if f.kernel {
			out = append(out, f)
		}
	}
	return out
}

// retire stops the kernel engine's fast path for good, once any flip in
// progress is done (HandOver, Close).
func (o *ownerAdmin) retire() {
	o.flipMu.Lock()
	o.retired = true
	o.flipMu.Unlock()
}

// flipKernel brings owner's change to the kernel engine on its fast path
// without the data plane's lock, and reports whether it did. It waits only
// for the kernel engine's own lock (a sync in progress). It does not when
// the engine's installed entries were not prepared for this change (a
// sync since the last preparation, as frequent resyncs do, leaves them
// unprepared until the next one, 100 ms later), or the published
// frontends are not those installed: the caller then takes the data
// plane's lock and syncs, after any Apply that runs.
func (d *DataPlane) flipKernel(owner string) bool {
	d.owners.flipMu.Lock()
	defer d.owners.flipMu.Unlock()
	if d.owners.retired {
		return false
	}
	ok, err := d.kernel.flipOwner(d.owners.kernelFrontends(), owner, d.m)
	if err != nil {
		d.log.Error(err, "Changing a node's state in the kernel engine; syncing its tables", "node", owner)
		return false
	}
	if ok {
		d.prepareKernelLater()
	}
	return ok
}
