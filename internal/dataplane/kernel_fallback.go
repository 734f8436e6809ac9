package dataplane

// kernelFailedLocked deals with the kernel path's failing under the kernel
// frontends (just taken out): auto says some were engine Auto's, named
// that some named the kernel engine. d.mu is held.
//
// Auto gives every frontend to the proxy from then on; with no frontend
// naming the kernel engine, what the path still holds in the kernel (its
// earlier tables or program, or a predecessor's) is removed, since it
// would go on taking the new flows of those addresses before the proxy's
// sockets see them. A failure between applies (a probe's or an admin
// state's sync, a repair) applies the last configuration again, so that
// the frontends it took out are served again, by the proxy or by a kernel
// path that works again; within an Apply, Apply does that itself.
func (d *DataPlane) kernelFailedLocked(err error, auto, named bool) {
	if auto && d.autoKernelFailed == nil {
		d.autoKernelFailed = err
		d.m.autoFallback.Set(1)
		d.log.Error(err, "The kernel engine failed: engine Auto serves every frontend with the proxy until ebb lb restarts")
		if !d.namesKernel(d.lastConfig) {
			if rmErr := d.kernel.remove(); rmErr != nil {
				d.log.Error(rmErr, "Removing what the failed kernel path holds in the kernel: it may still take new flows of its addresses")
			}
			d.kernelInstalled = false
		}
	}
	// Within an Apply, Apply says from its result whether any frontend
	// naming the kernel is left unserved.
	d.kernelFailing = d.kernelFailing || named
	if (auto || named) && !d.applying {
		cfg := d.lastConfig
		go func() {
			if _, err := d.Apply(cfg); err != nil {
				d.log.Error(err, "Applying the configuration again after the kernel path failed")
			}
		}()
	}
}

// namesKernel reports whether a frontend of cfg names the kernel engine,
// itself or through the data plane's default.
func (d *DataPlane) namesKernel(cfg Config) bool {
	for _, f := range cfg.Frontends {
		if f.Engine == EngineKernel || f.Engine == "" && d.engine == EngineKernel {
			return true
		}
	}
	return false
}

// KernelFailing reports whether a frontend that names the kernel engine is
// not served because the kernel path failed (after the last Apply, or a
// failure since): ebb lb's readiness, so that a rolling update that breaks
// the kernel path (an older kernel, a program the verifier refuses) stops
// at the first host. Frontends of engine Auto go to the proxy instead.
func (d *DataPlane) KernelFailing() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.kernelFailing
}
