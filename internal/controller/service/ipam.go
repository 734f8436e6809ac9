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
// which Service holds each. It is rebuilt from the Services' status when
// the controller starts, so allocations survive restarts and are never
// given twice.
type Allocator struct {
	pools []netip.Prefix

	mu    sync.Mutex
	owner map[netip.Addr]types.NamespacedName
}

// NewAllocator returns an allocator over the given CIDR pools.
func NewAllocator(pools []string) (*Allocator, error) {
	a := &Allocator{owner: map[netip.Addr]types.NamespacedName{}}
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

// Claim gives addr to svc: it must lie in a pool and be free or already
// svc's.
func (a *Allocator) Claim(addr netip.Addr, svc types.NamespacedName) error {
	addr = addr.Unmap()
	if !a.inPools(addr) {
		return fmt.Errorf("%s: %w", addr, ErrOutsidePools)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if o, ok := a.owner[addr]; ok && o != svc {
		return fmt.Errorf("%s is used by %s: %w", addr, o, ErrAddressTaken)
	}
	a.owner[addr] = svc
	return nil
}

// Allocate gives svc the first free address of a pool of the family
// (IPv4 when ipv6 is false), skipping a /24-or-larger IPv4 pool's network
// and broadcast addresses.
func (a *Allocator) Allocate(svc types.NamespacedName, ipv6 bool) (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
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
			if _, used := a.owner[addr]; !used {
				a.owner[addr] = svc
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

// Release frees every address of svc.
func (a *Allocator) Release(svc types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for addr, o := range a.owner {
		if o == svc {
			delete(a.owner, addr)
		}
	}
}

// Owned returns svc's addresses, sorted.
func (a *Allocator) Owned(svc types.NamespacedName) []netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []netip.Addr
	for addr, o := range a.owner {
		if o == svc {
			out = append(out, addr)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out
}

// InUse counts allocated addresses, for metrics.
func (a *Allocator) InUse() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.owner)
}
