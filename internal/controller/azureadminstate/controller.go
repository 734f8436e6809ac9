// Package azureadminstate drives the Azure admin-state manager from the
// nodes: the same leaving taints as the embedded load balancer (lbmodel),
// keyed by node UID, several changed nodes written in one batch.
package azureadminstate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/provider/azure"
)

// +kubebuilder:rbac:groups="",resources=nodes;services,verbs=get;list;watch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

const (
	// resync re-reads every pool and converges both ways this often when
	// no node is Down, so that a change made behind ebb's back heals.
	resync = 10 * time.Minute
	// DefaultDriftCheck is how often every pool is re-read while a node
	// is Down: cloud-provider-azure rewrites the same pools (from a cache
	// up to 120 s old) and can put a Down entry back to None; ebb puts it
	// back within this period. One list per load balancer per period,
	// writes only when something drifted.
	DefaultDriftCheck = 5 * time.Second
)

// Applier is the part of the manager the controller uses.
type Applier interface {
	SetAdminStates(ctx context.Context, want map[*azure.Node]azure.State) error
	Forget(node string)
	Invalidate()
}

// Reconciler applies nodes' admin states through the manager. Every node
// event wakes one reconcile of all nodes (a single key), so that nodes
// changing together are written together and a requeue is one pass, not
// one per node.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Manager  Applier
	Model    lbmodel.Options
	// DriftCheck overrides DefaultDriftCheck.
	DriftCheck time.Duration
	Clock      clock.PassiveClock

	mu sync.Mutex
	// applied is the state last converged per node UID (the draining set
	// and the nodes known to be None).
	applied map[types.UID]azure.State
	// known is each live node's identity in the pools, kept so that a
	// deleted node's entries can be turned Down before cloud-provider-azure
	// removes them; gone holds deleted nodes not yet turned Down.
	known, gone map[types.UID]*azure.Node
	// uids maps node names to the UID last seen, to notice replacements.
	uids map[string]types.UID
	// failing is the state whose failure was reported per node: one
	// Warning event per failing transition, not one per retry.
	failing  map[types.UID]azure.State
	lastFull time.Time
}

// allNodes is the single work key.
const allNodes = "all-nodes"

// SetupWithManager registers the controller on nodes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	all := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: allNodes}}}
	})
	return ctrl.NewControllerManagedBy(mgr).Named("azure-adminstate").Watches(&corev1.Node{}, all).Complete(r)
}

func (r *Reconciler) init() {
	if r.applied == nil {
		r.applied, r.uids, r.failing = map[types.UID]azure.State{}, map[string]types.UID{}, map[types.UID]azure.State{}
		r.known, r.gone = map[types.UID]*azure.Node{}, map[types.UID]*azure.Node{}
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.DriftCheck <= 0 {
		r.DriftCheck = DefaultDriftCheck
	}
}

// Reconcile applies, in one batch, every node whose state differs from the
// one applied. The first pass after a start, every resync, and every
// DriftCheck while a node is Down, is a full pass: every pool is re-read
// and every node, None ones too, converges, so that entries a previous run
// (or another writer) left wrong are put right.
func (r *Reconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.init()
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing nodes: %w", err)
	}
	states := map[types.UID]azure.State{}
	anyDown := len(r.gone) > 0
	for i := range nodes.Items {
		n := &nodes.Items[i]
		states[n.UID] = wanted(n, r.Model)
		anyDown = anyDown || states[n.UID] == azure.StateDown
	}
	now := r.Clock.Now()
	if since := now.Sub(r.lastFull); r.lastFull.IsZero() || since >= resync || anyDown && since >= r.DriftCheck {
		r.Manager.Invalidate()
		r.applied = map[types.UID]azure.State{}
		r.lastFull = now
	}

	want, byNode := r.wants(nodes.Items, states)

	// Wake for the next full pass when it is due, counted from the last
	// one, whichever reconcile asks: node events come often and each asks
	// again, and a requeue relative to now would keep pushing the drift
	// check back (CI saw a competing writer's None last 8 s).
	period := resync
	if anyDown {
		period = r.DriftCheck
	}
	result := ctrl.Result{RequeueAfter: max(r.lastFull.Add(period).Sub(now), 10*time.Millisecond)}
	if len(want) == 0 {
		return result, nil
	}
	err := r.Manager.SetAdminStates(ctx, want)
	var unmatched *azure.UnmatchedError
	if err != nil && !errors.As(err, &unmatched) {
		r.reportFailure(ctx, want, byNode, lbmodel.ReasonAdminStateUpdateFailed, err)
		return ctrl.Result{}, fmt.Errorf("setting the admin state of %v on Azure: %w", names(want), err)
	}
	r.recordApplied(ctx, want, byNode, unmatched)
	log.FromContext(ctx).V(1).Info("Applied admin states on Azure", "nodes", names(want))
	return result, nil
}

// wants are the nodes whose state is not known to be applied (all of them
// after a full pass), and the deleted nodes to turn Down, with the Node
// object of each live one.
func (r *Reconciler) wants(nodes []corev1.Node, states map[types.UID]azure.State) (map[*azure.Node]azure.State, map[*azure.Node]*corev1.Node) {
	want := map[*azure.Node]azure.State{}
	byNode := map[*azure.Node]*corev1.Node{}
	live := map[string]bool{}
	for i := range nodes {
		n := &nodes[i]
		live[n.Name] = true
		if old, ok := r.uids[n.Name]; ok && old != n.UID {
			r.Manager.Forget(n.Name) // replaced under the same name
			delete(r.applied, old)
		}
		r.uids[n.Name] = n.UID
		an := azureNode(n)
		r.known[n.UID] = an
		if last, ok := r.applied[n.UID]; ok && last == states[n.UID] {
			continue
		}
		want[an], byNode[an] = states[n.UID], n
	}
	r.noticeDeleted(states, live)
	for _, an := range r.gone {
		want[an] = azure.StateDown
	}
	return want, byNode
}

// recordApplied remembers what was applied, reports the nodes no pool
// holds, and lets go of the deleted nodes turned Down.
func (r *Reconciler) recordApplied(ctx context.Context, want map[*azure.Node]azure.State, byNode map[*azure.Node]*corev1.Node, unmatched *azure.UnmatchedError) {
	for an, s := range want {
		n := byNode[an]
		if n == nil {
			continue
		}
		if _, excluded := n.Labels[lbmodel.ExcludeNodeLabel]; !excluded && unmatched != nil && slices.Contains(unmatched.Nodes, an.Name) {
			// Not a success: reported once, looked at again by every
			// drift check while the node is Down. (A node excluded from
			// load balancers is in no pool by design.)
			r.reportFailure(ctx, map[*azure.Node]azure.State{an: s}, byNode, ReasonBackendNotFound, unmatched)
			continue
		}
		r.applied[n.UID] = s
		delete(r.failing, n.UID)
	}
	for uid, an := range r.gone {
		r.Manager.Forget(an.Name)
		delete(r.gone, uid)
	}
}

// noticeDeleted moves nodes that left the API to gone: their entries turn
// Down now (seed 000: "nodes being deleted trigger state flips prior to
// resource removal"); cloud-provider-azure removes them later. A node
// whose name or address a live node now has is a replacement: its entries
// are the live node's, and stay as that node wants them.
func (r *Reconciler) noticeDeleted(states map[types.UID]azure.State, live map[string]bool) {
	var liveIPs []string
	for uid, an := range r.known {
		if _, ok := states[uid]; ok {
			liveIPs = append(liveIPs, an.IPs...)
		}
	}
	for uid, an := range r.known {
		if _, ok := states[uid]; ok {
			continue
		}
		delete(r.known, uid)
		delete(r.applied, uid)
		delete(r.failing, uid)
		if r.uids[an.Name] == uid {
			delete(r.uids, an.Name)
		}
		if live[an.Name] || slices.ContainsFunc(an.IPs, func(ip string) bool { return slices.Contains(liveIPs, ip) }) {
			continue
		}
		r.gone[uid] = an
	}
}

// ReasonBackendNotFound is the Node event when no backend pool entry is
// the node's, so that its admin state cannot be set.
const ReasonBackendNotFound = "LoadBalancerBackendNotFound"

// reportFailure records one Warning event per node and failing state, on
// the node and on the Services whose traffic it carries (seed 000: events
// on the node and the Service, so that whoever owns either sees it).
func (r *Reconciler) reportFailure(ctx context.Context, want map[*azure.Node]azure.State, byNode map[*azure.Node]*corev1.Node, reason string, err error) {
	var reported []string
	for an, s := range want {
		n := byNode[an]
		if n == nil {
			continue
		}
		if last, ok := r.failing[n.UID]; ok && last == s {
			continue
		}
		r.failing[n.UID] = s
		reported = append(reported, n.Name)
		event.Publish(r.Recorder, nodeStateFailed(n, reason, s, err))
	}
	if len(reported) == 0 {
		return
	}
	sort.Strings(reported)
	svcs, lerr := r.affectedServices(ctx, reported)
	if lerr != nil {
		log.FromContext(ctx).Error(lerr, "Finding the Services a failed admin-state change affects")
		return
	}
	for i := range svcs {
		event.Publish(r.Recorder, serviceStateFailed(&svcs[i], reason, reported, err))
	}
}

// affectedServices are the LoadBalancer Services cloud-provider-azure
// serves (no loadBalancerClass) whose traffic goes through one of nodes:
// every node with externalTrafficPolicy Cluster, the nodes with a local
// endpoint with Local.
func (r *Reconciler) affectedServices(ctx context.Context, nodes []string) ([]corev1.Service, error) {
	var list corev1.ServiceList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing Services: %w", err)
	}
	var out []corev1.Service
	for _, svc := range list.Items {
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.Spec.LoadBalancerClass != nil {
			continue
		}
		if svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
			out = append(out, svc)
			continue
		}
		var eps discoveryv1.EndpointSliceList
		if err := r.Client.List(ctx, &eps, client.InNamespace(svc.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
			return nil, fmt.Errorf("listing the EndpointSlices of Service %s/%s: %w", svc.Namespace, svc.Name, err)
		}
		if hasEndpointOn(eps.Items, nodes) {
			out = append(out, svc)
		}
	}
	return out, nil
}

func hasEndpointOn(eps []discoveryv1.EndpointSlice, nodes []string) bool {
	for _, s := range eps {
		for _, e := range s.Endpoints {
			if e.NodeName != nil && slices.Contains(nodes, *e.NodeName) {
				return true
			}
		}
	}
	return false
}

// wanted is a node's admin state on Azure.
func wanted(n *corev1.Node, model lbmodel.Options) azure.State {
	if lbmodel.NodeAdminState(n, model) == lbmodel.AdminDown {
		return azure.StateDown
	}
	return azure.StateNone
}

func names(want map[*azure.Node]azure.State) []string {
	out := make([]string, 0, len(want))
	for an := range want {
		out = append(out, an.Name)
	}
	sort.Strings(out)
	return out
}

// azureNode is what identifies a node's backend entries.
func azureNode(n *corev1.Node) *azure.Node {
	out := &azure.Node{Name: n.Name, ProviderID: n.Spec.ProviderID}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			out.IPs = append(out.IPs, a.Address)
		}
	}
	return out
}
