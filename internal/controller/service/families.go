package service

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// What a Service's spec.ipFamilies and spec.ipFamilyPolicy let allocate
// give it.

// familyAddr is the Service's address of one family: the one it holds, or
// a new one.
func (r *Reconciler) familyAddr(holder Holder, held []netip.Addr, ipv6 bool) (netip.Addr, error) {
	for _, a := range held {
		if a.Is6() == ipv6 {
			return a, nil
		}
	}
	return r.IPAM.Allocate(holder, ipv6)
}

// familiesOf lists the Service's IP families, its primary first (IPv4 when
// none is set, which an API server never leaves so).
func familiesOf(svc *corev1.Service) []corev1.IPFamily {
	if len(svc.Spec.IPFamilies) == 0 {
		return []corev1.IPFamily{corev1.IPv4Protocol}
	}
	return svc.Spec.IPFamilies
}

func preferDualStack(svc *corev1.Service) bool {
	return svc.Spec.IPFamilyPolicy != nil && *svc.Spec.IPFamilyPolicy == corev1.IPFamilyPolicyPreferDualStack
}

func familyError(svc *corev1.Service, fam corev1.IPFamily, err error) error {
	policy := corev1.IPFamilyPolicySingleStack
	if svc.Spec.IPFamilyPolicy != nil {
		policy = *svc.Spec.IPFamilyPolicy
	}
	return fmt.Errorf("%s needs an %s address: %w: add an AddressPool (lb.ebb.dev) of %s that takes the Service, or free an address", policy, fam, err, fam)
}

// requestFitsFamilies refuses a requested address of a family the Service
// does not use (nobody could reach it: the Service's endpoints and node
// ports are of its families), and, for RequireDualStack, a request that
// leaves a family out.
func requestFitsFamilies(svc *corev1.Service, requested []netip.Addr) error {
	fams := familiesOf(svc)
	covered := map[corev1.IPFamily]bool{}
	for _, addr := range requested {
		fam := familyOf(addr)
		if !slices.Contains(fams, fam) {
			return fmt.Errorf("requested address %s is %s, but the Service's spec.ipFamilies are %v: ask for an address of its families, or change spec.ipFamilyPolicy", addr, fam, fams)
		}
		covered[fam] = true
	}
	if p := svc.Spec.IPFamilyPolicy; p != nil && *p == corev1.IPFamilyPolicyRequireDualStack && len(covered) < len(fams) {
		return fmt.Errorf("RequireDualStack needs an address of each of %v, and the requested addresses are %s only: ask for one of each family, or change spec.ipFamilyPolicy", fams, familyOf(requested[0]))
	}
	return nil
}

func familyOf(addr netip.Addr) corev1.IPFamily {
	if addr.Is6() {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}
