package service

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrlreconcile "sigs.k8s.io/controller-runtime/pkg/reconcile"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"

	"github.com/ebbdev/ebb/internal/addrrange"
)

// PoolFromAPI reads an AddressPool; a pool that cannot be read hands out
// nothing, and the error says what to fix.
func PoolFromAPI(ap *lbv1alpha1.AddressPool) (Pool, error) {
	p := Pool{Name: ap.Name, AutoAssign: ap.Spec.AutoAssign == nil || *ap.Spec.AutoAssign, CrossNamespaceSharing: ap.Spec.AllowSharingAcrossNamespaces}
	var bad []string
	for _, s := range ap.Spec.Addresses {
		r, err := addrrange.Parse(s)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		p.Ranges = append(p.Ranges, r)
	}
	if len(bad) > 0 {
		return Pool{}, fmt.Errorf("%w: %s", errInvalidAddresses, strings.Join(bad, "; "))
	}
	var err error
	if p.Services, err = selector(ap.Spec.ServiceSelector); err != nil {
		return Pool{}, fmt.Errorf("%w: spec.serviceSelector: %v", errInvalidSelector, err)
	}
	if p.Namespaces, err = selector(ap.Spec.NamespaceSelector); err != nil {
		return Pool{}, fmt.Errorf("%w: spec.namespaceSelector: %v", errInvalidSelector, err)
	}
	return p, nil
}

var (
	errInvalidAddresses = errors.New("invalid addresses")
	errInvalidSelector  = errors.New("invalid selector")
)

// selector is nil (anyone) for an absent or empty selector.
func selector(s *metav1.LabelSelector) (labels.Selector, error) {
	if s == nil || (len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0) {
		return nil, nil
	}
	return metav1.LabelSelectorAsSelector(s)
}

// loadPools gives the allocator every AddressPool that can be read.
func (r *Reconciler) loadPools(ctx context.Context) error {
	var list lbv1alpha1.AddressPoolList
	if err := r.Client.List(ctx, &list); err != nil {
		return fmt.Errorf("listing AddressPools: %w", err)
	}
	var pools []Pool
	for i := range list.Items {
		if p, err := PoolFromAPI(&list.Items[i]); err == nil {
			pools = append(pools, p)
		}
	}
	r.IPAM.SetPools(pools)
	return nil
}

// PoolReconciler keeps the allocator's pools in step with the
// AddressPools and writes each pool's status: how many of its addresses
// are used and free, whether it is Ready (its spec can be read) and
// Exhausted.
type PoolReconciler struct {
	Client client.Client
	IPAM   *Allocator
}

// SetupWithManager registers the pool controller: it wakes for every pool
// and, since usage changes with them, for every Service.
func (r *PoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("address-pool").For(&lbv1alpha1.AddressPool{}).
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(r.allPools)).
		Complete(r)
}

func (r *PoolReconciler) allPools(ctx context.Context, _ client.Object) []ctrlreconcile.Request {
	var list lbv1alpha1.AddressPoolList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil
	}
	out := make([]ctrlreconcile.Request, 0, len(list.Items))
	for _, p := range list.Items {
		out = append(out, ctrlreconcile.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
	}
	return out
}

// Reconcile reloads the pools and writes one pool's status.
func (r *PoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var list lbv1alpha1.AddressPoolList
	if err := r.Client.List(ctx, &list); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing AddressPools: %w", err)
	}
	var pools []Pool
	var self *lbv1alpha1.AddressPool
	var selfPool Pool
	var selfErr error
	for i := range list.Items {
		ap := &list.Items[i]
		p, err := PoolFromAPI(ap)
		if err == nil {
			pools = append(pools, p)
		}
		if ap.Name == req.Name {
			self, selfPool, selfErr = ap, p, err
		}
	}
	r.IPAM.SetPools(pools)
	if self == nil {
		return ctrl.Result{}, nil
	}
	want := self.DeepCopy()
	st := &want.Status
	st.ObservedGeneration = self.Generation
	if selfErr != nil {
		reason := lbv1alpha1.ReasonInvalidAddresses
		if errors.Is(selfErr, errInvalidSelector) {
			reason = lbv1alpha1.ReasonInvalidSelector
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: lbv1alpha1.ReadyCondition, Status: metav1.ConditionFalse,
			Reason: reason, Message: selfErr.Error() + "; the pool hands out no address until fixed", ObservedGeneration: self.Generation})
		st.AssignedIPv4, st.AssignedIPv6, st.AvailableIPv4, st.AvailableIPv6 = 0, 0, 0, 0
		meta.RemoveStatusCondition(&st.Conditions, lbv1alpha1.ExhaustedCondition)
	} else {
		r.usage(selfPool, st)
	}
	if equalPoolStatus(self.Status, *st) {
		return ctrl.Result{}, nil
	}
	if err := r.Client.Status().Patch(ctx, want, client.MergeFrom(self)); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("writing the status of AddressPool %s: %w", klog.KObj(self), err)
	}
	return ctrl.Result{}, nil
}

// usage fills the counts and the conditions of a pool that can be read.
func (r *PoolReconciler) usage(p Pool, st *lbv1alpha1.AddressPoolStatus) {
	size4, size6 := p.size()
	st.AssignedIPv4, st.AssignedIPv6 = r.IPAM.Usage(p)
	st.AvailableIPv4, st.AvailableIPv6 = max(0, size4-st.AssignedIPv4), max(0, size6-st.AssignedIPv6)
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: lbv1alpha1.ReadyCondition, Status: metav1.ConditionTrue,
		Reason: lbv1alpha1.ReasonServing, Message: "the pool's addresses are handed out", ObservedGeneration: st.ObservedGeneration})
	var empty []string
	if size4 > 0 && st.AvailableIPv4 == 0 {
		empty = append(empty, "IPv4")
	}
	if size6 > 0 && st.AvailableIPv6 == 0 {
		empty = append(empty, "IPv6")
	}
	if len(empty) > 0 {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: lbv1alpha1.ExhaustedCondition, Status: metav1.ConditionTrue,
			Reason: lbv1alpha1.ReasonNoAddressLeft, Message: "no " + strings.Join(empty, " or ") + " address left: add addresses or free some", ObservedGeneration: st.ObservedGeneration})
	} else {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: lbv1alpha1.ExhaustedCondition, Status: metav1.ConditionFalse,
			Reason: lbv1alpha1.ReasonAddressesLeft, Message: "addresses left", ObservedGeneration: st.ObservedGeneration})
	}
}

func saturatingAdd(a, b int64) int64 {
	if a > 0 && b > 0 && a+b < 0 {
		return 1<<63 - 1
	}
	return a + b
}

// equalPoolStatus compares two statuses, conditions by type, status,
// reason and message (not their transition times).
func equalPoolStatus(a, b lbv1alpha1.AddressPoolStatus) bool {
	if a.AssignedIPv4 != b.AssignedIPv4 || a.AssignedIPv6 != b.AssignedIPv6 || a.AvailableIPv4 != b.AvailableIPv4 ||
		a.AvailableIPv6 != b.AvailableIPv6 || a.ObservedGeneration != b.ObservedGeneration || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for _, c := range a.Conditions {
		d := meta.FindStatusCondition(b.Conditions, c.Type)
		if d == nil || d.Status != c.Status || d.Reason != c.Reason || d.Message != c.Message || d.ObservedGeneration != c.ObservedGeneration {
			return false
		}
	}
	return true
}
