package service

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlreconcile "sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=loadbalancerreports,verbs=get;list;watch

// awaitingRecheck is how often a Service whose addresses await an LB host
// is looked at without a report changing (a replica that stops reporting
// changes nothing).
const awaitingRecheck = 10 * time.Second

// publication splits the Service's addresses into those its status shows
// (the ones it shows already, and the ones an LB host serves now) and
// those that await an LB host. An address once published stays: an LB
// host that goes away later is the reports' and the events' to tell, and
// a status that flapped would move DNS records and clients for nothing.
func (r *Reconciler) publication(ctx context.Context, svc *corev1.Service, addrs []netip.Addr) (published, awaiting []netip.Addr, err error) {
	shown := map[netip.Addr]bool{}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(ing.IP); err == nil {
			shown[a.Unmap()] = true
		}
	}
	var served map[netip.Addr]bool
	for _, a := range addrs {
		if r.PublishAtOnce || shown[a] {
			published = append(published, a)
			continue
		}
		if served == nil {
			if served, err = r.servedAddresses(ctx); err != nil {
				return nil, nil, err
			}
		}
		if served[a] {
			published = append(published, a)
		} else {
			awaiting = append(awaiting, a)
		}
	}
	return published, awaiting, nil
}

// servedAddresses are the addresses a fresh LoadBalancerReport of a
// replica that is not draining lists as served.
func (r *Reconciler) servedAddresses(ctx context.Context) (map[netip.Addr]bool, error) {
	var reports v1alpha1.LoadBalancerReportList
	if err := r.Client.List(ctx, &reports); err != nil {
		return nil, fmt.Errorf("listing LoadBalancerReports to see which addresses are served: %w", err)
	}
	now := metav1.NewTime(r.Clock.Now())
	out := map[netip.Addr]bool{}
	for i := range reports.Items {
		st := &reports.Items[i].Status
		if st.Draining || !reports.Items[i].Fresh(now) {
			continue
		}
		addServed(out, st.Served)
	}
	return out, nil
}

// addServed adds a report's served addresses to set.
func addServed(set map[netip.Addr]bool, served []string) {
	for _, s := range served {
		if a, err := netip.ParseAddr(s); err == nil {
			set[a.Unmap()] = true
		}
	}
}

// servedCondition is the ServedCondition for addresses that await an LB
// host (none: True).
func servedCondition(svc *corev1.Service, awaiting []netip.Addr) metav1.Condition {
	if len(awaiting) > 0 {
		return lbmodel.AwaitingCondition(awaiting, svc.Generation)
	}
	return lbmodel.ServedConditionTrue(svc.Generation)
}

// awaitingServices are the Services of ours with an address that awaits
// an LB host and that the changed report now lists as served. Only those:
// every report changes at every address it starts serving, and waking
// every awaiting Service each time would fill the queue with reconciles
// that change nothing, behind which new Services wait (bench-service: 1,000
// Services took four times as long to be served).
func (r *Reconciler) awaitingServices(ctx context.Context, obj client.Object) []ctrlreconcile.Request {
	rep, ok := obj.(*v1alpha1.LoadBalancerReport)
	if !ok || rep.Status.Draining || len(rep.Status.Served) == 0 {
		return nil
	}
	served := make(map[netip.Addr]bool, len(rep.Status.Served))
	addServed(served, rep.Status.Served)
	return r.wantedServices(ctx, func(svc *corev1.Service) bool {
		return slices.ContainsFunc(lbmodel.AwaitingAddresses(svc), func(a netip.Addr) bool { return served[a] })
	})
}

// withoutAwaiting is the Service's conditions without the addresses in
// drop in its ServedCondition (writeNotAssigned takes them out of the
// ingress first).
func withoutAwaiting(svc *corev1.Service, drop []netip.Addr) []metav1.Condition {
	awaiting := slices.DeleteFunc(lbmodel.AwaitingAddresses(svc), func(a netip.Addr) bool { return slices.Contains(drop, a) })
	conds := slices.Clone(svc.Status.Conditions)
	switch {
	case meta.FindStatusCondition(conds, lbmodel.ServedCondition) == nil:
	case len(awaiting) == 0 && len(svc.Status.LoadBalancer.Ingress) == 0:
		// Nothing allocated is left: no condition, rather than a True
		// one that says every address is published.
		meta.RemoveStatusCondition(&conds, lbmodel.ServedCondition)
	default:
		meta.SetStatusCondition(&conds, servedCondition(svc, awaiting))
	}
	return conds
}
