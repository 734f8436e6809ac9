// Package lbhost answers one question for every signal that takes nodes
// out of service: would the load-balancer addresses still have an `ebb lb`
// replica to be announced from and accepted on? The NodeMaintenance
// webhook asks it before a drain, the spot controller before it marks a
// node leaving, so that no signal (a maintenance, or a preemption Event)
// can take the last load-balancer host away while another could serve.
package lbhost

import (
	"fmt"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// Stranding is what taking a set of nodes away would do to the serving
// `ebb lb` replicas.
type Stranding struct {
	// Hosts are the nodes of every serving replica, sorted.
	Hosts []string
	// Stranded names each serving replica ("REPORT on NODE") that runs on a
	// node being taken away, sorted. Empty when a serving replica stays,
	// or when no replica serves (there is nothing to protect then).
	Stranded []string
}

// Check reports whether taking away every node for which gone is true
// would leave no serving replica. A serving replica is a fresh
// LoadBalancerReport that names its host and is not draining, or an
// `ebb lb` pod without one (Unreported): unknown is not absent, so the
// check fails closed while replicas run that do not report.
func Check(reports []v1alpha1.LoadBalancerReport, unreported []corev1.Pod, now metav1.Time, gone func(node string) bool) Stranding {
	var s Stranding
	for _, p := range unreported {
		if !gone(p.Spec.NodeName) {
			return Stranding{}
		}
		s.Hosts = append(s.Hosts, p.Spec.NodeName)
		s.Stranded = append(s.Stranded, fmt.Sprintf("%s on %s (no fresh LoadBalancerReport)", p.Name, p.Spec.NodeName))
	}
	for i := range reports {
		r := &reports[i]
		if !r.Fresh(now) || r.Status.HostNode == "" || r.Status.Draining {
			continue
		}
		if !gone(r.Status.HostNode) {
			return Stranding{} // a serving replica stays
		}
		s.Hosts = append(s.Hosts, r.Status.HostNode)
		s.Stranded = append(s.Stranded, fmt.Sprintf("%s on %s", r.Name, r.Status.HostNode))
	}
	sort.Strings(s.Stranded)
	s.Hosts = slices.Compact(slices.Sorted(slices.Values(s.Hosts)))
	return s
}

// Strands reports whether any serving replica would be left without a
// host.
func (s Stranding) Strands() bool { return len(s.Stranded) > 0 }
