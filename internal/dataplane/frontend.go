package dataplane

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
)

// frontend is one listening socket and its current backend set.
type frontend struct {
	d   *DataPlane
	key frontendKey
	tcp *net.TCPListener // goroutines (Options.GoroutineProxy)
	lst *loopListener    // the event loop
	udp *net.UDPConn
	// stopReading: a successor reads the UDP socket now (HandOver).
	stopReading atomic.Bool
	// kernel: the kernel engine serves the frontend (no socket; the
	// kernel engine's table holds its rules).
	kernel bool

	set atomic.Pointer[backendSet]
	// backends by address; only Apply (under d.mu) changes it.
	backends map[netip.AddrPort]*backend

	flowsMu sync.Mutex
	flows   map[netip.AddrPort]*udpFlow
	// flowsBySource counts the flows of each client address (UDPLimits).
	flowsBySource map[netip.Addr]int
}

func newFrontend(d *DataPlane, k frontendKey, listener any) *frontend {
	f := &frontend{d: d, key: k, backends: map[netip.AddrPort]*backend{}, flows: map[netip.AddrPort]*udpFlow{}, flowsBySource: map[netip.Addr]int{}}
	switch l := listener.(type) {
	case nil:
		f.kernel = true
	case *net.TCPListener:
		f.tcp = l
	case *loopListener:
		f.lst = l
	case *net.UDPConn:
		f.udp = l
	}
	return f
}

// apply installs a new configuration of this frontend: backends that stay
// keep their runtime state, new ones are added, removed ones drain.
func (f *frontend) apply(cfg Frontend, probers map[probeKey]*prober, admin func(Backend) adminState) {
	if old := f.set.Load(); old != nil && sameShape(&old.cfg, &cfg) {
		// Only admin states changed (the drain path): flip them in place,
		// without rebuilding the set.
		for i, bc := range cfg.Backends {
			old.backends[i].update(bc, admin(bc))
		}
		return
	}
	backends := make([]*backend, 0, len(cfg.Backends))
	keep := map[netip.AddrPort]bool{}
	for _, bc := range cfg.Backends {
		ap := bc.AddrPort()
		keep[ap] = true
		b, ok := f.backends[ap]
		if !ok {
			b = newBackend(bc, f.d.m.forBackend(cfg.Name, bc), admin(bc))
			f.backends[ap] = b
		} else {
			b.update(bc, admin(bc))
		}
		if cfg.HealthCheck != nil {
			b.probe.Store(probers[probeKeyFor(cfg.HealthCheck, bc)])
		} else {
			b.probe.Store(nil)
		}
		backends = append(backends, b)
	}
	f.set.Store(newBackendSet(cfg, backends, f.set.Load()))
	for ap, b := range f.backends {
		if !keep[ap] {
			b.drain(cfg.DrainTimeout.Duration, f.d.clock, f.endConns(b))
			f.d.m.forget(b.m)
			delete(f.backends, ap)
		}
	}
}

// serve starts accepting on the frontend's socket.
func (f *frontend) serve() {
	switch {
	case f.tcp != nil:
		go f.acceptLoop()
	case f.lst != nil:
		f.lst.serve(f.d.loop, f)
	case f.udp != nil:
		go f.udpLoop()
	}
}

func (f *frontend) addr() net.Addr {
	switch {
	case f.tcp != nil:
		return f.tcp.Addr()
	case f.lst != nil:
		return net.TCPAddrFromAddrPort(f.lst.addr)
	case f.udp != nil:
		return f.udp.LocalAddr()
	case f.key.protocol == UDP:
		return net.UDPAddrFromAddrPort(f.key.addr)
	default:
		return net.TCPAddrFromAddrPort(f.key.addr)
	}
}

// remove stops the frontend taking new connections; its established TCP
// connections drain like those of removed backends.
func (f *frontend) remove() {
	f.closeSocket()
	drain := f.set.Load().cfg.DrainTimeout.Duration
	for ap, b := range f.backends {
		b.drain(drain, f.d.clock, f.endConns(b))
		f.d.m.forget(b.m)
		delete(f.backends, ap)
	}
	f.closeFlows()
}

// endConns returns what ends a draining backend's established connections:
// closing them (proxy), or deleting their conntrack entries (kernel: the
// next packet of such a flow is answered with a reset).
func (f *frontend) endConns(b *backend) func() {
	if !f.kernel {
		return func() { f.d.conns.closeBackend(b) }
	}
	return func() {
		if err := f.d.kernel.dropFlows(f.key, b.key); err != nil {
			f.d.log.Error(err, "Ending a drained backend's flows", "frontend", f.key.String(), "backend", b.addr)
		}
	}
}

// close ends everything at once (the data plane is shutting down).
func (f *frontend) close() {
	f.closeSocket()
	for _, b := range f.backends {
		b.removed.Store(true)
	}
	// Its TCP connections end in the data plane's Close, with all the
	// others (conns.closeAll).
	f.closeFlows()
}

func (f *frontend) closeSocket() {
	f.closeListener()
	if f.udp != nil {
		_ = f.udp.Close()
	}
}

// closeListener closes the TCP listener: established connections
// continue.
func (f *frontend) closeListener() {
	switch {
	case f.tcp != nil:
		_ = f.tcp.Close()
	case f.lst != nil:
		f.lst.close(f.d.loop)
	}
}

// sameShape reports whether two configurations of a frontend differ in
// nothing but their backends' admin states.
func sameShape(a, b *Frontend) bool {
	if a.Name != b.Name || a.Address != b.Address || a.Port != b.Port || a.Protocol != b.Protocol ||
		a.Balancing != b.Balancing || a.ProxyProtocol != b.ProxyProtocol ||
		a.ConnectTimeout != b.ConnectTimeout || a.IdleTimeout != b.IdleTimeout || a.DrainTimeout != b.DrainTimeout ||
		a.TCPKeepAlive != b.TCPKeepAlive || a.Engine != b.Engine ||
		!slices.Equal(a.SourceRanges, b.SourceRanges) || len(a.Backends) != len(b.Backends) {
		return false
	}
	if (a.HealthCheck == nil) != (b.HealthCheck == nil) || (a.HealthCheck != nil && *a.HealthCheck != *b.HealthCheck) {
		return false
	}
	for i := range a.Backends {
		x, y := a.Backends[i], b.Backends[i]
		x.AdminState, y.AdminState = "", ""
		if x != y {
			return false
		}
	}
	return true
}
