package lbsync

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	"github.com/go-logr/logr"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/internal/addrrange"
	"github.com/ebbdev/ebb/internal/dataplane"
)

// SkipOutsidePools: a Service's status names an address that lies in no
// AddressPool (nor in ebb lb's --vip-pool ranges). ebb lb neither serves
// nor announces it: whoever can write a Service's status could otherwise
// make every LB host announce any address, another network's included.
// MetalLB's speakers do the same.
const SkipOutsidePools dataplane.SkipReason = "OutsidePools"

// poolRanges is what the pools hold, as the syncer checks it.
type poolRanges struct {
	mu sync.Mutex
	// known: the pools have been read and there is at least one (API or
	// flags). Until then every address is served, as before the check: a
	// replica that starts (an upgrade, a restart) serves at once what its
	// predecessor served, and a cluster without AddressPools (ebb's CRDs
	// not served) is not taken offline.
	known  bool
	ranges []addrrange.Range
}

func (p *poolRanges) set(ranges []addrrange.Range) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.known, p.ranges = len(ranges) > 0, ranges
}

// admits reports whether addr may be served: it lies in a pool, or the
// pools are not known.
func (p *poolRanges) admits(addr string) bool {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return false // the data plane would refuse it anyway
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.known {
		return true
	}
	for _, r := range p.ranges {
		if r.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}

// SetPools gives the ranges ebb lb may serve addresses of: the
// AddressPools' and the --vip-pool flags' (none: every address). A change
// resyncs.
func (s *Syncer) SetPools(ranges []addrrange.Range) {
	s.pools.set(ranges)
	if s.running.Load() {
		s.kick()
	}
}

// outsidePools says why a frontend is not served.
func outsidePools(addr string) error {
	return fmt.Errorf("address %s lies in no AddressPool (lb.ebb.dev): ebb lb serves and announces only the pools' addresses; add it to a pool, or ask for an address of a pool (annotation lb.ebb.dev/load-balancer-ips), or recreate the Service", addr)
}

// FollowPools reads the AddressPools from c into the syncer, with the
// --vip-pool ranges flag, until ctx is done.
func (s *Syncer) FollowPools(ctx context.Context, c ctrlcache.Cache, flag []addrrange.Range) error {
	log := logr.FromContextOrDiscard(ctx).WithName("pools")
	changed, err := watchAll(ctx, c, &lbv1alpha1.AddressPool{})
	if err != nil {
		return err
	}
	for {
		var list lbv1alpha1.AddressPoolList
		if err := c.List(ctx, &list); err != nil {
			log.Error(err, "Reading the AddressPools")
		} else {
			s.SetPools(poolRangesOf(list.Items, flag))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// poolRangesOf are the ranges of the pools and of the flags. An entry
// that does not parse (the API's validation refuses it) is left out, the
// pool's other ranges kept: the controller hands out nothing from such a
// pool, but addresses it gave before stay served. The controller reads
// pools with service.PoolFromAPI, which ebb lb cannot import.
func poolRangesOf(pools []lbv1alpha1.AddressPool, flag []addrrange.Range) []addrrange.Range {
	ranges := append([]addrrange.Range(nil), flag...)
	for _, p := range pools {
		for _, a := range p.Spec.Addresses {
			if r, err := addrrange.Parse(a); err == nil {
				ranges = append(ranges, r)
			}
		}
	}
	return ranges
}
