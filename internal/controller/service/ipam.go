package service

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ebbdev/ebb/internal/addrrange"
)

// Errors the allocator returns; the controller turns them into Warning
// events that say what to change.
var (
	ErrPoolExhausted  = errors.New("every address of the pools is in use")
	ErrOutsidePools   = errors.New("the address is outside every pool")
	ErrAddressTaken   = errors.New("the address is used by another Service")
	ErrNoPoolOfFamily = errors.New("no pool of the Service's IP family is configured")
	ErrNoPool         = errors.New("no address pool takes the Service")
)

// Allocator hands out load-balancer addresses from pools and remembers
// which Services hold each. It is rebuilt from the Services' status when
// the controller starts, so allocations survive restarts and are never
// given twice. Services may share an address only when all of them ask to
// share with the same key and their ports do not collide.
type Allocator struct {
	// flagPools is the --vip-pool flags' pool (none without flags).
	flagPools []Pool

	mu sync.Mutex
	// apiPools are the AddressPools, by name (SetPools).
	apiPools []Pool
	holders  map[netip.Addr][]Holder
}

// Holder is a Service holding an address: its name, its sharing key (empty:
// it shares with nobody) and its ports ("TCP/80"), and what decides the
// pools it may draw from: the pool it names, its labels and its
// namespace's.
type Holder struct {
	Service  types.NamespacedName
	ShareKey string
	Ports    []string

	Pool                    string
	Labels, NamespaceLabels map[string]string
}

// canShareWith reports whether h may hold an address the others hold, in
// a pool that allows sharing across namespaces or not.
func (h Holder) canShareWith(others []Holder, acrossNamespaces bool) error {
	for _, o := range others {
		if o.Service == h.Service {
			continue
		}
		if h.ShareKey == "" || o.ShareKey != h.ShareKey {
			return fmt.Errorf("used by %s: %w (to share it, give both Services the annotation %s with the same value)", o.Service, ErrAddressTaken, ShareAnnotation)
		}
		if o.Service.Namespace != h.Service.Namespace && !acrossNamespaces {
			return fmt.Errorf("used by %s, in another namespace: %w (a sharing key is good within its namespace; an AddressPool with allowSharingAcrossNamespaces lets namespaces share its addresses)", o.Service, ErrAddressTaken)
		}
		if ports := h.portsOf(o); len(ports) > 0 {
			return fmt.Errorf("port %s is used by %s at that address: %w", ports[0], o.Service, ErrAddressTaken)
		}
	}
	return nil
}

// portsOf are h's ports that o uses too, in h's order.
func (h Holder) portsOf(o Holder) []string {
	var out []string
	for _, p := range h.Ports {
		if slices.Contains(o.Ports, p) {
			out = append(out, p)
		}
	}
	return out
}

// ShareAnnotation lets Services with the same value share an address when
// their ports do not collide.
const ShareAnnotation = "lb.ebb.dev/allow-shared-ip"

// NewAllocator returns an allocator over the --vip-pool flags' CIDRs
// (deprecated: AddressPools, given with SetPools, are the API's way; the
// flags create nothing in the API). Either may be empty.
func NewAllocator(flagPools []string) (*Allocator, error) {
	a := &Allocator{holders: map[netip.Addr][]Holder{}}
	if len(flagPools) == 0 {
		return a, nil
	}
	pool := Pool{Name: FlagPoolName, AutoAssign: true}
	for _, s := range flagPools {
		if strings.Contains(s, "-") {
			return nil, fmt.Errorf("address pool %q is not a CIDR like 10.96.255.0/24 or fd00:96::/112 (ranges go in an AddressPool)", s)
		}
		r, err := addrrange.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("address pool %q is not a CIDR like 10.96.255.0/24 or fd00:96::/112", s)
		}
		pool.Ranges = append(pool.Ranges, r)
	}
	a.flagPools = []Pool{pool}
	return a, nil
}

// SetPools replaces the AddressPools. Addresses held stay held, in a pool
// or not: a Service keeps its address when its pool changes.
func (a *Allocator) SetPools(pools []Pool) {
	pools = slices.Clone(pools)
	slices.SortFunc(pools, func(x, y Pool) int { return strings.Compare(x.Name, y.Name) })
	a.mu.Lock()
	defer a.mu.Unlock()
	a.apiPools = pools
}

// poolsLocked are the AddressPools by name, then the flags' pool.
func (a *Allocator) poolsLocked() []Pool {
	return append(slices.Clone(a.apiPools), a.flagPools...)
}

// poolsForLocked are the pools h may look at: the one it names, or all.
func (a *Allocator) poolsForLocked(h Holder) ([]Pool, error) {
	all := a.poolsLocked()
	if h.Pool == "" {
		return all, nil
	}
	for _, p := range all {
		if p.Name == h.Pool {
			return []Pool{p}, nil
		}
	}
	return nil, fmt.Errorf("%w: the Service asks for pool %s, and there is no AddressPool of that name that can be read (see kubectl get addresspool %s)", ErrNoPool, h.Pool, h.Pool)
}

// Claim gives addr to h: it must lie in a pool that admits h, and be free,
// already h's, or shareable with its holders.
func (a *Allocator) Claim(addr netip.Addr, h Holder) error {
	addr = addr.Unmap()
	a.mu.Lock()
	defer a.mu.Unlock()
	pools, err := a.poolsForLocked(h)
	if err != nil {
		return err
	}
	pool, err := admittingPool(pools, addr, h)
	if err != nil {
		return err
	}
	// A Service that holds the address already (its status, read at
	// start) keeps sharing it across namespaces: Services that shared so
	// before allowSharingAcrossNamespaces existed are not cut off.
	held := slices.ContainsFunc(a.holders[addr], func(o Holder) bool { return o.Service == h.Service })
	if err := h.canShareWith(a.holders[addr], pool.CrossNamespaceSharing || held); err != nil {
		return fmt.Errorf("%s is %w", addr, err)
	}
	a.holdLocked(addr, h)
	return nil
}

// admittingPool is the first of pools (those h may look at) that holds
// addr and admits h; a requested or shared address needs no autoAssign.
func admittingPool(pools []Pool, addr netip.Addr, h Holder) (Pool, error) {
	var refusals []string
	for _, p := range pools {
		if !p.contains(addr) {
			continue
		}
		named := h
		if named.Pool == "" {
			named.Pool = p.Name
		}
		if err := p.admits(named); err != nil {
			refusals = append(refusals, err.Error())
			continue
		}
		return p, nil
	}
	if len(refusals) == 0 {
		return Pool{}, fmt.Errorf("%s: %w", addr, ErrOutsidePools)
	}
	return Pool{}, fmt.Errorf("%s: %w (%s)", addr, ErrNoPool, strings.Join(refusals, "; "))
}

// Adopt notes that h holds addr, in a pool or not, as a Service's status
// says when the controller starts, unless a Service adopted before holds
// it and neither shares by a key: then h does not hold it (Conflicting
// names the holder). Two Services with one address in their status come from
// two leaders that each gave it out (a split brain), or from a status
// someone else wrote; the first adopted keeps it.
func (a *Allocator) Adopt(addr netip.Addr, h Holder) {
	addr = addr.Unmap()
	a.mu.Lock()
	defer a.mu.Unlock()
	// Only two Services that share by no key at all conflict here: a
	// Service keeps an address it shares while its key is edited (it
	// holds what it holds), so keys that differ now may have matched when
	// the address was given, and a restart must not move it.
	for _, o := range a.holders[addr] {
		if o.Service != h.Service && h.ShareKey == "" && o.ShareKey == "" {
			return
		}
	}
	a.holdLocked(addr, h)
}

// Conflicting names the Services that hold addr, which h (not one of its
// holders) may not share with them: h must not serve it.
func (a *Allocator) Conflicting(addr netip.Addr, h Holder) []types.NamespacedName {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conflictingLocked(addr.Unmap(), h)
}

func (a *Allocator) conflictingLocked(addr netip.Addr, h Holder) []types.NamespacedName {
	hs := a.holders[addr]
	if slices.ContainsFunc(hs, func(o Holder) bool { return o.Service == h.Service }) {
		return nil
	}
	var out []types.NamespacedName
	for _, o := range hs {
		// Sharers by key were allowed when they took it (the pools may
		// have changed since): only a Service that shares by no key, or
		// by another, conflicts.
		if h.ShareKey == "" || o.ShareKey != h.ShareKey {
			out = append(out, o.Service)
		}
	}
	return out
}

// Record notes that h holds addr, in a pool or not.
func (a *Allocator) Record(addr netip.Addr, h Holder) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.holdLocked(addr.Unmap(), h)
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
	pools, err := a.poolsForLocked(h)
	if err != nil {
		return netip.Addr{}, err
	}
	if h.ShareKey != "" {
		var shared []netip.Addr
		for addr, hs := range a.holders {
			if addr.Is6() != ipv6 || len(hs) == 0 {
				continue
			}
			// Sharing obeys the pools as a new address does: only in a
			// pool that admits h, and across namespaces only where the
			// pool allows it.
			if p, err := admittingPool(pools, addr, h); err == nil && h.canShareWith(hs, p.CrossNamespaceSharing) == nil {
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
	var refusals []string
	for _, p := range pools {
		if !p.hasFamily(ipv6) {
			continue
		}
		if err := p.admits(h); err != nil {
			refusals = append(refusals, err.Error())
			continue
		}
		found = true
		for _, r := range p.Ranges {
			if r.From.Is6() != ipv6 {
				continue
			}
			for addr := r.From; addr.IsValid() && r.Contains(addr); addr = addr.Next() {
				if len(a.holders[addr]) == 0 {
					a.holdLocked(addr, h)
					return addr, nil
				}
			}
		}
	}
	switch {
	case found:
		return netip.Addr{}, ErrPoolExhausted
	case len(refusals) > 0:
		return netip.Addr{}, fmt.Errorf("%w: %s", ErrNoPool, strings.Join(refusals, "; "))
	}
	return netip.Addr{}, ErrNoPoolOfFamily
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

// Collisions says which of h's ports other holders of addr use too: what a
// spec edit of a Service that shares its address can cause (the address
// is kept; the data plane serves each port for the Service that had it
// first, and ebb lb reports the other's frontend as not served).
func (a *Allocator) Collisions(addr netip.Addr, h Holder) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, o := range a.holders[addr.Unmap()] {
		if o.Service == h.Service {
			continue
		}
		for _, p := range h.portsOf(o) {
			out = append(out, fmt.Sprintf("port %s at %s is also %s's", p, addr, o.Service))
		}
	}
	return out
}

// Pools are the AddressPools by name, then the flags' pool.
func (a *Allocator) Pools() []Pool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.poolsLocked()
}

// Usage counts the addresses of p held by Services, by family.
func (a *Allocator) Usage(p Pool) (v4, v6 int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for addr, hs := range a.holders {
		if len(hs) > 0 && p.contains(addr) {
			if addr.Is4() {
				v4++
			} else {
				v6++
			}
		}
	}
	return v4, v6
}

// InUse counts allocated addresses, for metrics.
func (a *Allocator) InUse() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.holders)
}
