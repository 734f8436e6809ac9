package dataplane

import (
	"hash/fnv"
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
	// slotSeed is a hash of the address, which ranks the backend for the
	// kernel engine's slots (rendezvousScore).
	slotSeed uint64
	// flowLabel labels the kernel engine's flows to the backend, on the
	// nftables path (see flowLabelOf).
	flowLabel flowLabel

	m              backendMetrics
	adminPublished bool // read and written under the owners' lock (ownerAdmin.mu) only
}

// newBackend returns a backend of b with admin state admin; the owners'
// lock is held.
func newBackend(b Backend, m backendMetrics, admin adminState) *backend {
	ap := b.AddrPort()
	be := &backend{key: ap, addr: net.JoinHostPort(ap.Addr().String(), strconv.Itoa(int(ap.Port()))), owner: b.Owner, m: m}
	be.slotSeed = addrSeed(be.addr)
	be.flowLabel = flowLabelOf(ap)
	be.update(b, admin)
	return be
}

// addrSeed is the FNV-1a hash of a backend's address.
func addrSeed(addr string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(addr))
	return h.Sum64()
}

// update applies a backend's changeable settings, with admin state admin
// (the configuration's, or the node fast path's). A new admin state takes
// effect for new connections at once; its metric follows. The owners'
// lock is held.
func (b *backend) update(cfg Backend, admin adminState) {
	b.setAdminState(admin)
	b.weight.Store(int32(cfg.Weight))
}

// setAdminState changes the admin state; the owners' lock is held.
func (b *backend) setAdminState(state adminState) {
	if old := adminState(b.admin.Swap(int32(state))); old != state || !b.adminPublished {
		b.m.setAdminState(state)
		b.adminPublished = true
	}
}

// eligible reports whether the backend may take a new connection: never
// once removed or when admin Down, always when admin Up, else as its probe
// says.
func (b *backend) eligible() bool { return b.eligibleAs(adminState(b.admin.Load())) }

// eligibleAs is eligible as if the backend's admin state were admin.
func (b *backend) eligibleAs(admin adminState) bool {
	if b.removed.Load() {
		return false
	}
	switch admin {
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
