package dataplane

import (
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"
)

// adminState is AdminState as an int, for atomic access on the hot path.
type adminState int32

const (
	adminNone adminState = iota
	adminDown
	adminUp
)

func toAdminState(s AdminState) adminState {
	switch s {
	case AdminDown:
		return adminDown
	case AdminUp:
		return adminUp
	default:
		return adminNone
	}
}

// backend is the runtime state of one backend of one frontend. It outlives
// configuration changes that keep its address, so its connection counts,
// metrics and tracked connections carry over.
type backend struct {
	key   netip.AddrPort
	addr  string // key as "ip:port", for dialing
	owner string

	admin   atomic.Int32 // adminState
	weight  atomic.Int32
	probe   atomic.Pointer[prober] // nil: no health check, always healthy
	removed atomic.Bool
	active  atomic.Int64

	// inKernel: the kernel engine's installed table sends new flows to
	// the backend (kernel frontends only).
	inKernel atomic.Bool

	m              backendMetrics
	adminPublished bool // only Apply (under the data plane's lock) reads or writes it
}

func newBackend(b Backend, m backendMetrics) *backend {
	ap := b.AddrPort()
	be := &backend{key: ap, addr: net.JoinHostPort(ap.Addr().String(), strconv.Itoa(int(ap.Port()))), owner: b.Owner, m: m}
	be.update(b)
	return be
}

// update applies a backend's changeable settings. A new admin state takes
// effect for new connections at once; its metric follows.
func (b *backend) update(cfg Backend) {
	b.setAdminState(toAdminState(cfg.AdminState))
	b.weight.Store(int32(cfg.Weight))
}

// setAdminState changes the admin state; the data plane's lock is held.
func (b *backend) setAdminState(state adminState) {
	if old := adminState(b.admin.Swap(int32(state))); old != state || !b.adminPublished {
		b.m.setAdminState(state)
		b.adminPublished = true
	}
}

// eligible reports whether the backend may take a new connection: never
// once removed or when admin Down, always when admin Up, else as its probe
// says.
func (b *backend) eligible() bool {
	if b.removed.Load() {
		return false
	}
	switch adminState(b.admin.Load()) {
	case adminDown:
		return false
	case adminUp:
		return true
	}
	p := b.probe.Load()
	return p == nil || p.healthy.Load()
}

// drain marks the backend removed: it takes no new connection or UDP flow.
// Its established connections continue, or end after timeout if one is set
// (end ends them).
func (b *backend) drain(timeout time.Duration, clk Clock, end func()) {
	b.removed.Store(true)
	if timeout > 0 {
		clk.AfterFunc(timeout, end)
	}
}
