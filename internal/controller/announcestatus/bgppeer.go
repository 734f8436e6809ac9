// Package announcestatus writes the status of the announcement objects
// from what the LB hosts' ebb lb replicas report in their
// LoadBalancerReports: each BGPPeer's sessions per host, and each
// AnnouncementPolicy's hosts and L2 owners.
package announcestatus

import (
	"cmp"
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
)

// +kubebuilder:rbac:groups=lb.ebb.dev,resources=bgppeers,verbs=get;list;watch
// +kubebuilder:rbac:groups=lb.ebb.dev,resources=bgppeers/status,verbs=get;update;patch

// BGPPeerReconciler writes the BGPPeers' status.
type BGPPeerReconciler struct {
	Client client.Client
	Clock  clock.PassiveClock
}

// SetupWithManager registers the controller: it wakes for every BGPPeer
// and, since the sessions change with them, for every report and Node.
func (r *BGPPeerReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	return ctrl.NewControllerManagedBy(mgr).Named("bgp-peer").For(&lbv1alpha1.BGPPeer{}).
		Watches(&v1alpha1.LoadBalancerReport{}, handler.EnqueueRequestsFromMapFunc(r.allPeers)).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.allPeers)).
		Complete(r)
}

func (r *BGPPeerReconciler) allPeers(ctx context.Context, _ client.Object) []ctrlreconcile.Request {
	var list lbv1alpha1.BGPPeerList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil
	}
	return requests(list.Items)
}

// Reconcile writes one BGPPeer's status.
func (r *BGPPeerReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var peer lbv1alpha1.BGPPeer
	if err := r.Client.Get(ctx, req.NamespacedName, &peer); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	fresh, nodes, err := freshReports(ctx, r.Client, r.Clock.Now())
	if err != nil {
		return ctrl.Result{}, err
	}
	want := peer.DeepCopy()
	want.Status = PeerStatus(&peer, fresh, nodes)
	if equalStatus(peer.Status, want.Status) {
		return ctrl.Result{RequeueAfter: recheck}, nil
	}
	if err := r.Client.Status().Patch(ctx, want, client.MergeFrom(&peer)); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("writing the status of BGPPeer %s: %w", klog.KObj(&peer), err)
	}
	return ctrl.Result{RequeueAfter: recheck}, nil
}

// PeerStatus is a peer's status from the fresh reports of the LB hosts and
// those hosts' Node labels. A host with several reports (a hand-off under
// way) shows its best session.
func PeerStatus(peer *lbv1alpha1.BGPPeer, reports []v1alpha1.LoadBalancerReport, nodes map[string]labels.Set) lbv1alpha1.BGPPeerStatus {
	st := lbv1alpha1.BGPPeerStatus{ObservedGeneration: peer.Generation, Conditions: slices.Clone(peer.Status.Conditions)}
	condition := func(status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: lbv1alpha1.EstablishedCondition, Status: status,
			Reason: reason, Message: msg, ObservedGeneration: peer.Generation})
	}
	sel := labels.Everything()
	if peer.Spec.NodeSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(peer.Spec.NodeSelector)
		if err != nil {
			condition(metav1.ConditionFalse, lbv1alpha1.ReasonInvalidSelector, fmt.Sprintf("spec.nodeSelector: %v; no LB host peers until it is fixed", err))
			return st
		}
		sel = s
	}
	addr, _ := netip.ParseAddr(peer.Spec.PeerAddress)
	byNode := map[string]lbv1alpha1.BGPSessionStatus{}
	for _, rep := range reports {
		host := rep.Status.HostNode
		if !sel.Matches(nodes[host]) {
			continue
		}
		s := sessionOf(host, addr.Unmap(), rep.Status.Announcement)
		if have, ok := byNode[host]; !ok || rank(s) > rank(have) {
			byNode[host] = s
		}
	}
	var down []string
	for _, s := range byNode {
		st.Sessions = append(st.Sessions, s)
	}
	slices.SortFunc(st.Sessions, func(a, b lbv1alpha1.BGPSessionStatus) int { return cmp.Compare(a.Node, b.Node) })
	for _, s := range st.Sessions {
		if s.State == "established" {
			st.Established++
			continue
		}
		d := s.Node + ": " + s.State
		if s.Message != "" {
			d += " (" + s.Message + ")"
		}
		down = append(down, d)
	}
	st.Selected = int32(len(st.Sessions))
	switch {
	case st.Selected == 0:
		condition(metav1.ConditionFalse, lbv1alpha1.ReasonNoHosts, "no LB host that the nodeSelector chooses runs ebb lb")
	case len(down) > 0:
		condition(metav1.ConditionFalse, lbv1alpha1.ReasonSessionsDown, fmt.Sprintf("%d of %d sessions not established: %s", len(down), st.Selected, strings.Join(down, "; ")))
	default:
		condition(metav1.ConditionTrue, lbv1alpha1.ReasonAllEstablished, fmt.Sprintf("all %d sessions established", st.Selected))
	}
	return st
}

// sessionOf is a host's session with addr in its report; configuring when
// the report does not name the peer yet.
func sessionOf(host string, addr netip.Addr, a *v1alpha1.Announcement) lbv1alpha1.BGPSessionStatus {
	if a != nil {
		for _, s := range a.BGPPeers {
			if got, err := netip.ParseAddr(s.Address); err == nil && got.Unmap() == addr {
				return lbv1alpha1.BGPSessionStatus{Node: host, State: s.State, Message: s.Message}
			}
		}
	}
	return lbv1alpha1.BGPSessionStatus{Node: host, State: lbv1alpha1.SessionConfiguring}
}

// rank orders the sessions of one host's reports: established first.
func rank(s lbv1alpha1.BGPSessionStatus) int {
	switch s.State {
	case "established":
		return 3
	case lbv1alpha1.SessionConfiguring:
		return 0
	case lbv1alpha1.SessionError:
		return 1
	default:
		return 2
	}
}

// equalStatus compares two statuses, conditions without their times.
func equalStatus(a, b lbv1alpha1.BGPPeerStatus) bool {
	a.Conditions, b.Conditions = withoutTimes(a.Conditions), withoutTimes(b.Conditions)
	return equality.Semantic.DeepEqual(a, b)
}
