// Package evacuator reads the evacuators a pod registers in its
// annotations (KEP-4212's evacuation.coordination.k8s.io/priority_<class>,
// here maintenance.ebb.dev/evacuator-priority_<class>: "<priority>/<role>").
// The NodeMaintenance controller writes them into the Evacuations it
// creates, and admission resolves every Evacuation's from its pod, so that
// what an Evacuation lists is what the pod registered, whoever created it.
package evacuator

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// Registered reads a pod's evacuator annotations, highest priority first
// (then by class), at most v1alpha1.MaxEvacuators of them; malformed ones
// (a priority that is not an int32, a class or role longer than a label
// value) are skipped.
func Registered(p *corev1.Pod) []v1alpha1.Evacuator {
	var out []v1alpha1.Evacuator
	for k, v := range p.Annotations {
		class, ok := strings.CutPrefix(k, v1alpha1.EvacuatorAnnotationPrefix)
		if !ok || class == "" {
			continue
		}
		prio, role, _ := strings.Cut(v, "/")
		n, err := strconv.ParseInt(prio, 10, 32)
		if err != nil || len(class) > maxNameLength || len(role) > maxNameLength {
			continue
		}
		out = append(out, v1alpha1.Evacuator{EvacuatorClass: class, Priority: int32(n), Role: v1alpha1.EvacuatorRole(role)})
	}
	slices.SortFunc(out, func(a, b v1alpha1.Evacuator) int {
		if c := cmp.Compare(b.Priority, a.Priority); c != 0 {
			return c // not a subtraction: int32 priorities far apart overflow
		}
		return strings.Compare(a.EvacuatorClass, b.EvacuatorClass)
	})
	if len(out) > v1alpha1.MaxEvacuators {
		out = out[:v1alpha1.MaxEvacuators]
	}
	return out
}

// maxNameLength bounds an evacuator's class and role (the CRD's schema).
const maxNameLength = 63
