// Package azureadminstate drives the Azure admin-state manager from the
// nodes: the same leaving taints as the embedded load balancer (lbmodel),
// keyed by node UID, several changed nodes written in one batch.
package azureadminstate

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/provider/azure"
)

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// resync re-applies everything periodically (the manager's cache is
// invalidated), so a change made behind ebb's back heals.
const resync = 10 * time.Minute

// Applier is the part of the manager the controller uses.
type Applier interface {
	SetAdminStates(ctx context.Context, want map[*azure.Node]armnetwork.LoadBalancerBackendAddressAdminState) error
	Forget(node string)
	Invalidate()
}

// Reconciler applies nodes' admin states through the manager.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Manager  Applier
	Model    lbmodel.Options

	mu sync.Mutex
	// applied is the state last applied per node UID (the draining set).
	applied map[types.UID]armnetwork.LoadBalancerBackendAddressAdminState
	// uids maps node names to the UID last seen, to notice replacements.
	uids     map[string]types.UID
	lastFull time.Time
}

// SetupWithManager registers the controller on nodes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("azure-adminstate").For(&corev1.Node{}).Complete(r)
}

// Reconcile applies, in one batch, every node whose state differs from the
// one applied (not only the node that changed: draining several nodes at
// once makes one write per pool).
func (r *Reconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.applied == nil {
		r.applied, r.uids = map[types.UID]armnetwork.LoadBalancerBackendAddressAdminState{}, map[string]types.UID{}
	}
	if time.Since(r.lastFull) > resync {
		r.Manager.Invalidate()
		r.applied = map[types.UID]armnetwork.LoadBalancerBackendAddressAdminState{}
		r.lastFull = time.Now()
	}
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing nodes: %w", err)
	}
	want := map[*azure.Node]armnetwork.LoadBalancerBackendAddressAdminState{}
	byName := map[string]*corev1.Node{}
	seen := map[types.UID]bool{}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		seen[n.UID] = true
		if old, ok := r.uids[n.Name]; ok && old != n.UID {
			r.Manager.Forget(n.Name) // replaced under the same name
		}
		r.uids[n.Name] = n.UID
		state := armnetwork.LoadBalancerBackendAddressAdminStateNone
		if lbmodel.AdminState(n, r.Model) == dataplane.AdminDown {
			state = armnetwork.LoadBalancerBackendAddressAdminStateDown
		}
		if last, ok := r.applied[n.UID]; ok && last == state || !ok && state == armnetwork.LoadBalancerBackendAddressAdminStateNone {
			continue
		}
		want[azureNode(n)] = state
		byName[n.Name] = n
	}
	for uid := range r.applied {
		if !seen[uid] {
			delete(r.applied, uid) // deleted: its entries go with normal reconciliation
		}
	}
	if len(want) == 0 {
		return ctrl.Result{RequeueAfter: resync}, nil
	}
	if err := r.Manager.SetAdminStates(ctx, want); err != nil {
		names := make([]string, 0, len(byName))
		for name, n := range byName {
			names = append(names, name)
			r.Recorder.Eventf(n, nil, corev1.EventTypeWarning, lbmodel.ReasonAdminStateUpdateFailed, "AdminState",
				"Could not set this node's Azure load balancer backends' admin state: %v (retrying with backoff)", err)
		}
		sort.Strings(names)
		return ctrl.Result{}, fmt.Errorf("setting the admin state of %v on Azure: %w", names, err)
	}
	for an, s := range want {
		r.applied[byName[an.Name].UID] = s
	}
	log.FromContext(ctx).Info("Applied admin states on Azure", "nodes", len(want))
	return ctrl.Result{RequeueAfter: resync}, nil
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
