package service

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// Errors the allocator returns; the controller turns them into Warning
// events that say what to change.
var (
	ErrPoolExhausted  = errors.New("every address of the pools is in use")
	ErrOutsidePools   = errors.New("the address is outside every pool")
	ErrAddressTaken   = errors.New("the address is used by another Service")
	ErrNoPoolOfFamily = errors.New("no pool of the Service's IP family is configured")
)

// Allocator hands out load-balancer addresses from pools and remembers
// which Services hold each. It is rebuilt from the Services' status when
// the controller starts, so allocations survive restarts and are never
// given twice. Services may share an address only when all of them ask to
// share with the same key and their ports do not collide.
type Allocator struct {
	pools []netip.Prefix

	mu      sync.Mutex
	holders map[netip.Addr][]Holder
}

// Holder is a Service holding an address: its name, its sharing key (empty:
// it shares with nobody) and its ports ("TCP/80").
type Holder struct {
	Service  types.NamespacedName
	ShareKey string
	Ports    []string
}

// canShareWith reports whether h may hold an address the others hold.
func (h Holder) canShareWith(others []Holder) error {
	for _, o := range others {
		if o.Service == h.Service {
			continue
		}
		if h.ShareKey == "" || o.ShareKey != h.ShareKey {
			return fmt.Errorf("used by %s: %w (to share it, give both Services the annotation %s with the same value)", o.Service, ErrAddressTaken, ShareAnnotation)
		}
		for _, p := range h.Ports {
			for _, q := range o.Ports {
				if p == q {
					return fmt.Errorf("port %s is used by %s at that address: %w", p, o.Service, ErrAddressTaken)
				}
			}
		}
	}
	return nil
}

// ShareAnnotation lets Services with the same value share an address when
// their ports do not collide.
const ShareAnnotation = "lb.ebb.dev/allow-shared-ip"

// NewAllocator returns an allocator over the given CIDR pools.
func NewAllocator(pools []string) (*Allocator, error) {
	a := &Allocator{holders: map[netip.Addr][]Holder{}}
	if len(pools) == 0 {
		return nil, errors.New("no address pool: give at least one --vip-pool, like 10.96.255.0/24")
	}
	for _, p := range pools {
		prefix, err := netip.ParsePrefix(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("address pool %q is not a CIDR like 10.96.255.0/24 or fd00:96::/112", p)
		}
		a.pools = append(a.pools, prefix.Masked())
	}
	return a, nil
}

func (a *Allocator) inPools(addr netip.Addr) bool {
	for _, p := range a.pools {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// Claim gives addr to h: it must lie in a pool and be free, already h's,
// or shareable with its holders.
func (a *Allocator) Claim(addr netip.Addr, h Holder) error {
	addr = addr.Unmap()
	if !a.inPools(addr) {
		return fmt.Errorf("%s: %w", addr, ErrOutsidePools)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := h.canShareWith(a.holders[addr]); err != nil {
		return fmt.Errorf("%s is %w", addr, err)
	}
	a.holdLocked(addr, h)
	return nil
}

// holdLocked records h at addr, replacing an older record of its Service.
func (a *Allocator) holdLocked(addr netip.Addr, h Holder) {
	hs := a.holders[addr][:0:0]
	for _, o := range a.holders[addr] {
		if o.Service != h.Service {
			hs = append(hs, o)
		}
	}
	a.holders[addr] = append(hs, h)
}

// Allocate gives h an address of the family (IPv4 when ipv6 is false): one
// it can share if it asks to share, else the first free one, skipping a
// /24-or-larger IPv4 pool's network and broadcast addresses.
func (a *Allocator) Allocate(h Holder, ipv6 bool) (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if h.ShareKey != "" {
		var shared []netip.Addr
		for addr, hs := range a.holders {
			if addr.Is6() == ipv6 && len(hs) > 0 && h.canShareWith(hs) == nil {
				shared = append(shared, addr)
			}
		}
		if len(shared) > 0 {
			sort.Slice(shared, func(i, j int) bool { return shared[i].Less(shared[j]) })
			a.holdLocked(shared[0], h)
			return shared[0], nil
		}
	}
	found := false
	for _, p := range a.pools {
		if p.Addr().Is6() != ipv6 {
			continue
		}
		found = true
		for addr := p.Addr(); p.Contains(addr); addr = addr.Next() {
			if !ipv6 && p.Bits() <= 24 && (addr == p.Addr() || isBroadcast(p, addr)) {
				continue
			}
			if len(a.holders[addr]) == 0 {
				a.holdLocked(addr, h)
				return addr, nil
			}
		}
	}
	if !found {
		return netip.Addr{}, ErrNoPoolOfFamily
	}
	return netip.Addr{}, ErrPoolExhausted
}

func isBroadcast(p netip.Prefix, addr netip.Addr) bool {
	next := addr.Next()
	return !next.IsValid() || !p.Contains(next)
}

// Release frees svc's hold on every address.
func (a *Allocator) Release(svc types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for addr, hs := range a.holders {
		kept := hs[:0:0]
		for _, h := range hs {
			if h.Service != svc {
				kept = append(kept, h)
			}
		}
		if len(kept) == 0 {
			delete(a.holders, addr)
		} else {
			a.holders[addr] = kept
		}
	}
}

// Owned returns svc's addresses, sorted.
func (a *Allocator) Owned(svc types.NamespacedName) []netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []netip.Addr
	for addr, hs := range a.holders {
		for _, h := range hs {
			if h.Service == svc {
				out = append(out, addr)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out
}

// InUse counts allocated addresses, for metrics.
func (a *Allocator) InUse() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.holders)
}
