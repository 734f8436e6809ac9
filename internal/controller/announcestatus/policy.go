package announcestatus

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrlreconcile "sigs.k8s.io/controller-runtime/pkg/reconcile"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/addrrange"
)

// +kubebuilder:rbac:groups=lb.ebb.dev,resources=announcementpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=lb.ebb.dev,resources=announcementpolicies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=lb.ebb.dev,resources=addresspools,verbs=get;list;watch

// PolicyReconciler writes the AnnouncementPolicies' status.
type PolicyReconciler struct {
	Client client.Client
	Clock  clock.PassiveClock
}

// SetupWithManager registers the controller: it wakes for every policy
// and, since its hosts and owners change with them, for every report,
// Node and AddressPool.
func (r *PolicyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	all := handler.EnqueueRequestsFromMapFunc(r.allPolicies)
	return ctrl.NewControllerManagedBy(mgr).Named("announcement-policy").For(&lbv1alpha1.AnnouncementPolicy{}).
		Watches(&v1alpha1.LoadBalancerReport{}, all).
		Watches(&corev1.Node{}, all).
		Watches(&lbv1alpha1.AddressPool{}, all).
		Complete(r)
}

func (r *PolicyReconciler) allPolicies(ctx context.Context, _ client.Object) []ctrlreconcile.Request {
	var list lbv1alpha1.AnnouncementPolicyList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil
	}
	return requests(list.Items)
}

// Reconcile writes one AnnouncementPolicy's status.
func (r *PolicyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var policy lbv1alpha1.AnnouncementPolicy
	if err := r.Client.Get(ctx, req.NamespacedName, &policy); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var pools lbv1alpha1.AddressPoolList
	if err := r.Client.List(ctx, &pools); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing AddressPools: %w", err)
	}
	fresh, nodes, err := freshReports(ctx, r.Client, r.Clock.Now())
	if err != nil {
		return ctrl.Result{}, err
	}
	want := policy.DeepCopy()
	want.Status = PolicyStatus(&policy, pools.Items, fresh, nodes)
	if equalPolicyStatus(policy.Status, want.Status) {
		return ctrl.Result{RequeueAfter: recheck}, nil
	}
	if err := r.Client.Status().Patch(ctx, want, client.MergeFrom(&policy)); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("writing the status of AnnouncementPolicy %s: %w", klog.KObj(&policy), err)
	}
	return ctrl.Result{RequeueAfter: recheck}, nil
}

// PolicyStatus is a policy's status: how it announces, the hosts it
// chooses that report, and the owner of each of its L2 addresses.
func PolicyStatus(policy *lbv1alpha1.AnnouncementPolicy, pools []lbv1alpha1.AddressPool, reports []v1alpha1.LoadBalancerReport, nodes map[string]labels.Set) lbv1alpha1.AnnouncementPolicyStatus {
	st := lbv1alpha1.AnnouncementPolicyStatus{ObservedGeneration: policy.Generation, Conditions: slices.Clone(policy.Status.Conditions)}
	var by []string
	if policy.Spec.BGP != nil {
		by = append(by, "BGP")
	}
	if policy.Spec.L2 != nil {
		by = append(by, "L2")
	}
	st.AnnouncedBy = strings.Join(by, "+")
	ready := func(status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: lbv1alpha1.ReadyCondition, Status: status,
			Reason: reason, Message: msg, ObservedGeneration: policy.Generation})
	}
	sel := labels.Everything()
	if policy.Spec.NodeSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(policy.Spec.NodeSelector)
		if err != nil {
			ready(metav1.ConditionFalse, lbv1alpha1.ReasonInvalidSelector, fmt.Sprintf("spec.nodeSelector: %v; no LB host follows the policy until it is fixed", err))
			return st
		}
		sel = s
	}
	// The policy's addresses; nil ranges with all: every address.
	all := len(policy.Spec.AddressPools) == 0
	var ranges []addrrange.Range
	var missing []string
	for _, name := range policy.Spec.AddressPools {
		i := slices.IndexFunc(pools, func(p lbv1alpha1.AddressPool) bool { return p.Name == name })
		if i < 0 {
			missing = append(missing, name)
			continue
		}
		for _, s := range pools[i].Spec.Addresses {
			if rg, err := addrrange.Parse(s); err == nil {
				ranges = append(ranges, rg)
			}
		}
	}
	covers := func(a netip.Addr) bool {
		return all || slices.ContainsFunc(ranges, func(rg addrrange.Range) bool { return rg.Contains(a) })
	}
	hosts := map[string]bool{}
	owners := map[string]string{}
	for _, rep := range reports {
		host := rep.Status.HostNode
		if !sel.Matches(nodes[host]) {
			continue
		}
		hosts[host] = true
		if policy.Spec.L2 == nil || rep.Status.Announcement == nil {
			continue
		}
		for _, s := range rep.Status.Announcement.L2Owned {
			a, err := netip.ParseAddr(s)
			if err != nil || !covers(a.Unmap()) {
				continue
			}
			if have, ok := owners[s]; !ok || host < have {
				owners[s] = host
			}
		}
	}
	st.Hosts = int32(len(hosts))
	for addr, node := range owners {
		st.L2Owners = append(st.L2Owners, lbv1alpha1.L2Owner{Address: addr, Node: node})
	}
	slices.SortFunc(st.L2Owners, func(a, b lbv1alpha1.L2Owner) int {
		return netip.MustParseAddr(a.Address).Compare(netip.MustParseAddr(b.Address))
	})
	switch {
	case len(missing) > 0:
		ready(metav1.ConditionFalse, lbv1alpha1.ReasonPoolNotFound, fmt.Sprintf("no AddressPool %s: create it or take it out of spec.addressPools (the other pools are announced)", strings.Join(missing, ", ")))
	case st.Hosts == 0:
		ready(metav1.ConditionFalse, lbv1alpha1.ReasonNoHosts, "no LB host that the nodeSelector chooses runs ebb lb: nothing announces these addresses")
	default:
		ready(metav1.ConditionTrue, lbv1alpha1.ReasonAnnouncing, fmt.Sprintf("announced by %s from %d LB hosts", st.AnnouncedBy, st.Hosts))
	}
	return st
}

// equalPolicyStatus compares two statuses, conditions without their times.
func equalPolicyStatus(a, b lbv1alpha1.AnnouncementPolicyStatus) bool {
	a.Conditions, b.Conditions = withoutTimes(a.Conditions), withoutTimes(b.Conditions)
	return equality.Semantic.DeepEqual(a, b)
}
