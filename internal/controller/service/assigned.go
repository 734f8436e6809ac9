package service

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// AddressAssignedCondition is the condition that says whether ebb gave a
// Service its load-balancer addresses: True (reason
// ReasonAddressAssigned) names them; False says why not (reasons
// ReasonAllocationFailed, ReasonUnsupportedPort), with what to change, so
// that `kubectl get svc -o yaml` or `kubectl wait
// --for=condition=lb.ebb.dev/AddressAssigned` shows what an EXTERNAL-IP
// stuck at <pending> is waiting for. lb.ebb.dev/Served (lbmodel) then
// says whether the LB hosts serve them.
const AddressAssignedCondition = "lb.ebb.dev/AddressAssigned"

// Reasons of AddressAssignedCondition.
const (
	ReasonAddressAssigned  = "AddressAssigned"
	ReasonAllocationFailed = "AllocationFailed"
	ReasonUnsupportedPort  = "UnsupportedPort"
)

// assignedCondition is the True AddressAssignedCondition for addrs, and
// the families the Service asked for and did not get (skipped, as the
// Normal AddressFamilyUnavailable says).
func assignedCondition(svc *corev1.Service, addrs []netip.Addr, skipped string) metav1.Condition {
	msg := "assigned " + joinAddrs(addrs)
	if skipped != "" {
		msg += "; " + skipped
	}
	return metav1.Condition{Type: AddressAssignedCondition, Status: metav1.ConditionTrue, Reason: ReasonAddressAssigned,
		ObservedGeneration: svc.Generation, Message: msg}
}

// notAssignedCondition is a False AddressAssignedCondition.
func notAssignedCondition(svc *corev1.Service, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: AddressAssignedCondition, Status: metav1.ConditionFalse, Reason: reason,
		ObservedGeneration: svc.Generation, Message: msg}
}

// hasCondition says whether conds already say what c says (the time
// aside).
func hasCondition(conds []metav1.Condition, c metav1.Condition) bool {
	old := meta.FindStatusCondition(conds, c.Type)
	return old != nil && old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message && old.ObservedGeneration == c.ObservedGeneration
}

// writeNotAssigned takes drop (addresses another Service holds) out of the
// Service's status and sets its False AddressAssignedCondition, in one
// write, and none when the status says so already (a retry every 30 s
// writes nothing while the cause lasts).
func (r *Reconciler) writeNotAssigned(ctx context.Context, svc *corev1.Service, drop []netip.Addr, cond metav1.Condition) error {
	ingress := slices.DeleteFunc(slices.Clone(svc.Status.LoadBalancer.Ingress), func(in corev1.LoadBalancerIngress) bool {
		addr, err := netip.ParseAddr(in.IP)
		return err == nil && slices.Contains(drop, addr.Unmap())
	})
	if len(ingress) == len(svc.Status.LoadBalancer.Ingress) && hasCondition(svc.Status.Conditions, cond) {
		return nil
	}
	patch := client.MergeFromWithOptions(svc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	svc.Status.LoadBalancer.Ingress = ingress
	svc.Status.Conditions = withoutAwaiting(svc, drop)
	meta.SetStatusCondition(&svc.Status.Conditions, cond)
	if err := r.Client.Status().Patch(ctx, svc, patch); err != nil {
		return fmt.Errorf("writing why %s has no address (%s): %w", klog.KObj(svc), cond.Reason, err)
	}
	return nil
}
