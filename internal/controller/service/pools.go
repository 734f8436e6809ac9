package service

import (
	"fmt"
	"net/netip"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/ebbdev/ebb/internal/addrrange"
)

// Pool is one source of load-balancer addresses: an AddressPool, or the
// controller's --vip-pool flags.
type Pool struct {
	// Name is the AddressPool's name (FlagPoolName for the flags).
	Name   string
	Ranges []addrrange.Range
	// AutoAssign: Services that name no pool draw from it.
	AutoAssign bool
	// Services and Namespaces select who may draw from it (nil: anyone).
	Services, Namespaces labels.Selector
	// CrossNamespaceSharing lets Services of different namespaces share
	// an address of the pool (with one sharing key); otherwise a key
	// shares only within its namespace.
	CrossNamespaceSharing bool
}

// FlagPoolName names the pool of the --vip-pool flags.
const FlagPoolName = "--vip-pool"

// size counts the pool's addresses by family (each capped at the largest
// int64).
func (p Pool) size() (v4, v6 int64) {
	for _, rg := range p.Ranges {
		if rg.From.Is4() {
			v4 = saturatingAdd(v4, rg.Size())
		} else {
			v6 = saturatingAdd(v6, rg.Size())
		}
	}
	return v4, v6
}

func (p Pool) contains(a netip.Addr) bool {
	for _, r := range p.Ranges {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

func (p Pool) hasFamily(ipv6 bool) bool {
	for _, r := range p.Ranges {
		if r.From.Is6() == ipv6 {
			return true
		}
	}
	return false
}

// admits says why h may not draw from p (nil: it may). Asking for the pool
// by name overrides autoAssign, not the selectors.
func (p Pool) admits(h Holder) error {
	if h.Pool == "" && !p.AutoAssign {
		return fmt.Errorf("pool %s is not auto-assigned: name it in the annotation lb.ebb.dev/address-pool", p.Name)
	}
	if p.Services != nil && !p.Services.Matches(labels.Set(h.Labels)) {
		return fmt.Errorf("pool %s takes only Services with labels %s", p.Name, p.Services)
	}
	if p.Namespaces != nil && !p.Namespaces.Matches(labels.Set(h.NamespaceLabels)) {
		return fmt.Errorf("pool %s takes only Services in namespaces with labels %s", p.Name, p.Namespaces)
	}
	return nil
}
