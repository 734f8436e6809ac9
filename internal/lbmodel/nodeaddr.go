package lbmodel

import (
	"net/netip"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
)

// DuplicateAddress is an InternalIP that more than one Node gives: a
// reinstalled machine whose old Node lingers, or edge nodes behind one
// NAT. The load balancers keep one backend for the address, the Kept
// node's, so that the duplicate costs its own backend and nothing else.
type DuplicateAddress struct {
	Address netip.Addr
	Kept    string
	Dropped []string
}

// DuplicateNodeAddresses returns, sorted by address, every InternalIP that
// more than one eligible node gives, with the node the load balancers
// keep for it (preferNode) and the others.
func DuplicateNodeAddresses(nodes []*corev1.Node) []DuplicateAddress {
	byAddr := map[netip.Addr][]*corev1.Node{}
	for _, n := range nodes {
		if !EligibleNode(n) {
			continue
		}
		for _, ip := range InternalIPs(n) {
			byAddr[ip] = append(byAddr[ip], n)
		}
	}
	var out []DuplicateAddress
	for addr, ns := range byAddr {
		if len(ns) < 2 {
			continue
		}
		sort.Slice(ns, func(i, j int) bool { return preferNode(ns[i], ns[j]) })
		d := DuplicateAddress{Address: addr, Kept: ns[0].Name}
		for _, n := range ns[1:] {
			d.Dropped = append(d.Dropped, n.Name)
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Address.Less(out[j].Address) })
	return out
}

// InternalIPs are a node's InternalIP addresses as the load balancers key
// them (parseIP: leading zeros read, IPv4-mapped as IPv4), each once.
func InternalIPs(n *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, ok := parseIP(a.Address); ok && !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	return out
}

// preferNode reports whether a is kept over b when both give one address:
// the Ready one, then the newer one (a machine reinstalled under a new
// name registers after its old Node), then by name, so that every
// replica keeps the same one.
func preferNode(a, b *corev1.Node) bool {
	if ra, rb := nodeReady(a), nodeReady(b); ra != rb {
		return ra
	}
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return b.CreationTimestamp.Before(&a.CreationTimestamp)
	}
	return a.Name < b.Name
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
