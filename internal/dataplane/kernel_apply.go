package dataplane

import (
	"fmt"
	"time"
)

// removeEngineSwitches removes the running frontends whose engine the new
// configuration changes, so that the new one starts afresh: its socket
// opens (to the proxy) or closes (to the kernel). The established
// connections of a proxy frontend drain as a removed frontend's do.
func (d *DataPlane) removeEngineSwitches(admitted []Frontend) {
	for _, fc := range admitted {
		k := fc.key()
		if f, ok := d.frontends[k]; ok && f.kernel != (fc.Engine == EngineKernel) {
			f.remove()
			delete(d.frontends, k)
		}
	}
}

// syncKernelLocked syncs the kernel engine's tables with the kernel
// frontends, if there are any or the tables hold some. Without prepare,
// the entries prepared for the nodes' next changes are brought up to date
// a little later (see kernelEngine.sync), so that an admin-state or probe
// change takes effect at once. A frontend the path has no room for is
// taken out and returned as skipped, the others are served. When the
// tables cannot be installed, every kernel frontend is taken out and
// returned as skipped (the previous tables, if any, stay in the kernel).
// d.mu is held.
func (d *DataPlane) syncKernelLocked(prepare bool) []SkippedFrontend {
	if d.handedOver {
		return nil // the tables are the successor's now
	}
	d.settleKernelLocked()
	kernel := d.kernelFrontendsLocked()
	if len(kernel) == 0 && !d.kernelInstalled {
		return nil
	}
	var skipped []SkippedFrontend
	fits, full, err := d.kernel.fit(kernel)
	if err != nil {
		d.m.kernelFailures.Inc() // the path could not be loaded
	} else {
		for f, why := range full {
			skipped = append(skipped, SkippedFrontend{Name: f.set.Load().cfg.Name, Reason: SkipKernelFull, Err: fmt.Errorf("kernel engine: %s", why)})
			f.remove()
			delete(d.frontends, f.key)
		}
		if len(full) > 0 {
			d.publishFrontendsLocked()
		}
		kernel = fits
		var stale bool
		if stale, err = d.kernel.sync(kernel, d.m, prepare); err == nil {
			d.kernelInstalled = len(kernel) > 0
			if stale {
				d.prepareKernelLater()
			}
			return skipped
		}
	}
	auto, named := false, false
	for _, f := range kernel {
		cfg := &f.set.Load().cfg
		skipped = append(skipped, SkippedFrontend{Name: cfg.Name, Reason: SkipKernelFailed, Err: fmt.Errorf("kernel engine: %w", err)})
		f.remove()
		delete(d.frontends, f.key)
		auto, named = auto || cfg.auto, named || !cfg.auto
	}
	d.publishFrontendsLocked()
	d.kernelFailedLocked(fmt.Errorf("kernel engine: %w", err), auto, named)
	return skipped
}

// settleKernelLocked deals, once, with what predecessors left in the
// kernel, which would otherwise go on forwarding past this data plane:
// the state of the path it uses is taken over by its first sync (with no
// kernel frontend, that sync leaves nothing for new flows, and the
// established ones end on their own), and the state of the other path (a
// --kernel-path switched) is removed, ending the flows it carried. Before
// this, a data plane with no kernel frontend never touched a table a
// predecessor left, and that table took every new flow of its addresses
// from the proxy's sockets. d.mu is held.
func (d *DataPlane) settleKernelLocked() {
	if d.kernelSettled {
		return
	}
	d.kernelSettled = true
	if found, err := d.kernel.hasState(); err != nil {
		d.log.Info("Cannot tell whether an earlier ebb lb left kernel engine state; leaving it as it is", "err", err.Error())
	} else if found {
		d.kernelInstalled = true
	}
	switch found, err := d.otherKernel.hasState(); {
	case err != nil:
		d.log.Info("Cannot tell whether an earlier ebb lb left state of the other kernel path; leaving it as it is", "err", err.Error())
	case found:
		d.log.Info("Removing the state an earlier ebb lb left on the other kernel path (--kernel-path changed); the connections it forwarded end", "path", d.kernelPathName)
		if err := d.otherKernel.remove(); err != nil {
			d.log.Error(err, "Removing the other kernel path's state; it may go on forwarding new flows")
		}
	}
}

// KernelStateLeft reports whether an earlier ebb lb left the state of
// this data plane's kernel path on the host (its tables or pinned maps):
// the kernel went on forwarding that process's flows while none ran (a
// crash, a stop without a successor). Ask before the first Apply, which
// takes that state over.
func (d *DataPlane) KernelStateLeft() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	found, err := d.kernel.hasState()
	return err == nil && found
}

// kernelFrontendsLocked lists the frontends the kernel engine serves.
// d.mu is held.
func (d *DataPlane) kernelFrontendsLocked() []*frontend {
	var kernel []*frontend
	for _, f := range d.frontends {
		if f.kernel {
			kernel = append(kernel, f)
		}
	}
	return kernel
}

// setKernelOwnerLocked brings owner's change to the kernel engine: on its
// fast path when the installed entries were prepared for it, else by a
// sync. d.mu is held.
func (d *DataPlane) setKernelOwnerLocked(owner string) []SkippedFrontend {
	if d.handedOver {
		return nil
	}
	kernel := d.kernelFrontendsLocked()
	ok, err := d.kernel.flipOwner(kernel, owner, d.m)
	switch {
	case err != nil:
		d.log.Error(err, "Changing a node's state in the kernel engine; syncing its tables", "node", owner)
	case ok:
		d.prepareKernelLater()
		return nil
	}
	return d.syncKernelLocked(false)
}

// kernelPrepareDelay is how long after a change the kernel's prepared
// entries are brought up to date: long enough that the nodes of one
// maintenance, tainted one after another, each change on the fast path,
// rather than each waiting for the previous one's preparation.
const kernelPrepareDelay = 100 * time.Millisecond

// prepareKernelLater schedules a sync that prepares the kernel's entries
// for the owners' next changes, unless one is scheduled.
func (d *DataPlane) prepareKernelLater() {
	if !d.kernelPrepareDue.CompareAndSwap(false, true) {
		return
	}
	d.clock.AfterFunc(kernelPrepareDelay, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.kernelPrepareDue.Store(false)
		if d.closed {
			return
		}
		for _, s := range d.syncKernelLocked(true) {
			d.log.Error(s.Err, "Preparing the kernel engine's entries for the next change", "frontend", s.Name)
		}
	})
}

// markKernelDirty asks for the kernel table to be synced again; a probe
// calls it when a backend's health changes. It never blocks.
func (d *DataPlane) markKernelDirty() {
	select {
	case d.kernelDirty <- struct{}{}:
	default:
	}
}

// resyncKernelOnProbes rebuilds the kernel table when asked, until the
// data plane closes.
func (d *DataPlane) resyncKernelOnProbes() {
	for {
		select {
		case <-d.stopSweep:
			return
		case <-d.kernelDirty:
		}
		d.mu.Lock()
		if !d.closed {
			for _, s := range d.syncKernelLocked(false) {
				d.log.Error(s.Err, "Rebuilding the kernel engine's table after a probe changed", "frontend", s.Name)
			}
		}
		d.mu.Unlock()
	}
}

// RemoveKernelTable removes the kernel engine's nftables table, or on the
// eBPF path its program and pinned maps: its frontends' flows are no
// longer forwarded. Close leaves them in place on purpose; this is for
// uninstalling and tests.
func (d *DataPlane) RemoveKernelTable() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.kernelInstalled = false
	return d.kernel.remove()
}
