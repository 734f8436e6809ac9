package dataplane

import "fmt"

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

// syncKernelLocked rebuilds the kernel engine's table from the kernel
// frontends, if there are any or the table holds some. When the table
// cannot be installed, every kernel frontend is taken out and returned as
// skipped (the previous table, if any, stays in the kernel). d.mu is held.
func (d *DataPlane) syncKernelLocked() []SkippedFrontend {
	if d.handedOver {
		return nil // the tables are the successor's now
	}
	var kernel []*frontend
	for _, f := range d.frontends {
		if f.kernel {
			kernel = append(kernel, f)
		}
	}
	if len(kernel) == 0 && !d.kernelInstalled {
		return nil
	}
	err := d.kernel.sync(kernel, d.m)
	if err == nil {
		d.kernelInstalled = len(kernel) > 0
		return nil
	}
	var skipped []SkippedFrontend
	for _, f := range kernel {
		name := f.set.Load().cfg.Name
		skipped = append(skipped, SkippedFrontend{Name: name, Reason: SkipKernelFailed, Err: fmt.Errorf("kernel engine: %w", err)})
		f.remove()
		delete(d.frontends, f.key)
	}
	return skipped
}

// markKernelDirty asks for the kernel table to be rebuilt; a probe calls
// it when a backend's health changes. It never blocks.
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
			for _, s := range d.syncKernelLocked() {
				d.log.Error(s.Err, "Rebuilding the kernel engine's table after a probe changed", "frontend", s.Name)
			}
		}
		d.mu.Unlock()
	}
}

// RemoveKernelTable removes the kernel engine's nftables table: new flows
// to its frontends are no longer forwarded. Close leaves the table in
// place on purpose; this is for uninstalling and tests.
func (d *DataPlane) RemoveKernelTable() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.kernelInstalled = false
	return d.kernel.remove()
}
