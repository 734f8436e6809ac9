package adminstate

import (
	"context"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// InternalIPIndex indexes Nodes by each InternalIP as the load balancers
// key it (lbmodel.InternalIPs).
const InternalIPIndex = "ebb.internalIP"

// IndexInternalIPs is InternalIPIndex's function.
func IndexInternalIPs(o client.Object) []string {
	n, ok := o.(*corev1.Node)
	if !ok {
		return nil
	}
	var out []string
	for _, ip := range lbmodel.InternalIPs(n) {
		out = append(out, ip.String())
	}
	return out
}

// ReasonDuplicateAddress: the node gives an InternalIP another Node gives
// too, and the load balancers keep the other one's backend for it.
const ReasonDuplicateAddress = "DuplicateNodeAddress"

// duplicateReports remembers, per dropped node, the duplicate last
// reported, so that a Warning is published once per duplicate and not at
// every Node update (again after a restart, which is when an operator
// looks).
type duplicateReports struct {
	mu   sync.Mutex
	last map[string]string
}

// reportDuplicates publishes a Warning on every node whose InternalIP
// another node gives too and whose backend the load balancers drop for
// it, naming both (lbmodel.DuplicateNodeAddresses). node is the one being
// reconciled: only duplicates involving it are looked at, and as each
// node is reconciled at start and on change, every duplicate is found.
func (r *Reconciler) reportDuplicates(ctx context.Context, node *corev1.Node) error {
	// Only the nodes that give one of this node's addresses, from the
	// cache's index: listing every Node at each Node event cost O(nodes)
	// per event, O(nodes²) as a large cluster's nodes report.
	var nodes []*corev1.Node
	byName := map[string]*corev1.Node{}
	for _, ip := range lbmodel.InternalIPs(node) {
		var list corev1.NodeList
		if err := r.Client.List(ctx, &list, client.MatchingFields{InternalIPIndex: ip.String()}); err != nil {
			return fmt.Errorf("listing the nodes that give %s: %w", ip, err)
		}
		for i := range list.Items {
			if n := &list.Items[i]; byName[n.Name] == nil {
				byName[n.Name] = n
				nodes = append(nodes, n)
			}
		}
	}
	r.duplicates.mu.Lock()
	defer r.duplicates.mu.Unlock()
	if r.duplicates.last == nil {
		r.duplicates.last = map[string]string{}
	}
	for _, d := range lbmodel.DuplicateNodeAddresses(nodes) {
		involved := d.Kept == node.Name
		for _, n := range d.Dropped {
			involved = involved || n == node.Name
		}
		if !involved {
			continue
		}
		for _, dropped := range d.Dropped {
			key := d.Address.String() + " " + d.Kept
			if r.duplicates.last[dropped] == key {
				continue
			}
			r.duplicates.last[dropped] = key
			event.Publish(r.Recorder, duplicateAddress(byName[dropped], d))
		}
	}
	return nil
}

func duplicateAddress(dropped *corev1.Node, d lbmodel.DuplicateAddress) event.Event {
	return event.Event{Regarding: dropped, Type: corev1.EventTypeWarning, Reason: ReasonDuplicateAddress, Action: "AdminState",
		Note: fmt.Sprintf("InternalIP %s is given by node %s too (nodes %s): load balancers send the address's traffic as node %s's and leave this node out. "+
			"Delete this Node if its machine is gone or was reinstalled under another name; give each node an address of its own otherwise",
			d.Address, d.Kept, strings.Join(append([]string{d.Kept}, d.Dropped...), ", "), d.Kept)}
}
