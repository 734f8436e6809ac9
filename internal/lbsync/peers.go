package lbsync

import (
	"context"
	"net/netip"
	"slices"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// +kubebuilder:rbac:groups=maintenance.ebb.dev,resources=loadbalancerreports,verbs=list;watch

// Peer is another LB host that is not draining.
type Peer struct {
	Node string
	Addr netip.Addr
	// Joined is when its replica last started announcing (zero: long
	// ago, or unknown).
	Joined time.Time
}

// JoinedBefore orders hosts by when they joined, the node name breaking
// ties: a joining host forwards only to those that joined before it, so
// forwarding never loops.
func (p Peer) JoinedBefore(q Peer) bool {
	if !p.Joined.Equal(q.Joined) {
		return p.Joined.Before(q.Joined)
	}
	return p.Node < q.Node
}

// DrainingPeers follows the other `ebb lb` replicas and says which LB
// hosts are draining: those whose replica reports itself draining, or
// whose Node is leaving (seen at once, before the replica's report says
// so). Their addresses are where this host sends the segments of flows
// the routers moved here (internal/flowfwd).
type DrainingPeers struct {
	// Cache holds LoadBalancerReports and Nodes; Run starts it.
	Cache ctrlcache.Cache
	// Self is this replica's node, never a peer.
	Self  string
	Model lbmodel.Options
	// OnChange is told the peers whenever they change: the addresses of
	// the draining ones (sorted), and the others.
	OnChange func(draining []netip.Addr, serving []Peer)
	// Resync re-reads everything this often, so that a report going stale
	// (a replica that is gone) is noticed; default 2 s.
	Resync time.Duration
}

// Run follows the peers until ctx is done.
func (p *DrainingPeers) Run(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("peers")
	if p.Resync <= 0 {
		p.Resync = 2 * time.Second
	}
	go func() { _ = p.Cache.Start(ctx) }()
	changed, err := watchAll(ctx, p.Cache, &v1alpha1.LoadBalancerReport{}, &corev1.Node{})
	if err != nil {
		return err
	}
	var lastDraining []netip.Addr
	var lastServing []Peer
	tick := time.NewTicker(p.Resync)
	defer tick.Stop()
	for first := true; ; first = false {
		draining, serving, err := p.peers(ctx)
		if err != nil {
			log.Error(err, "Reading the other load-balancer hosts")
		} else if first || !slices.Equal(draining, lastDraining) || !slices.Equal(serving, lastServing) {
			lastDraining, lastServing = draining, serving
			log.Info("Other load-balancer hosts", "draining", draining, "serving", serving)
			p.OnChange(draining, serving)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}

// peers lists the LB hosts other than Self: the addresses of those whose
// replica drains or whose Node is leaving, and the others.
func (p *DrainingPeers) peers(ctx context.Context) (draining []netip.Addr, serving []Peer, err error) {
	var reports v1alpha1.LoadBalancerReportList
	if err := p.Cache.List(ctx, &reports); err != nil {
		return nil, nil, err
	}
	now := metav1.NewTime(time.Now())
	for _, r := range reports.Items {
		host := r.Status.HostNode
		if host == "" || host == p.Self || !r.Fresh(now) {
			continue
		}
		var node corev1.Node
		if err := p.Cache.Get(ctx, keyOf(host), &node); err != nil {
			continue // gone: nothing to send to
		}
		a, ok := internalIPv4(&node)
		if !ok {
			continue
		}
		leaving, _ := lbmodel.IsLeaving(&node, p.Model)
		if r.Status.Draining || leaving {
			draining = appendOnce(draining, a)
			continue
		}
		peer := Peer{Node: host, Addr: a}
		if r.Status.JoinTime != nil {
			peer.Joined = r.Status.JoinTime.Time
		}
		serving = append(serving, peer)
	}
	// A host with a draining and a serving replica (a hand-off under way)
	// counts as draining: its old replica holds flows.
	serving = slices.DeleteFunc(serving, func(p Peer) bool { return slices.Contains(draining, p.Addr) })
	slices.SortFunc(draining, func(a, b netip.Addr) int { return a.Compare(b) })
	slices.SortFunc(serving, func(a, b Peer) int { return a.Addr.Compare(b.Addr) })
	return draining, serving, nil
}

func appendOnce(s []netip.Addr, a netip.Addr) []netip.Addr {
	if slices.Contains(s, a) {
		return s
	}
	return append(s, a)
}

func keyOf(name string) client.ObjectKey { return client.ObjectKey{Name: name} }

// internalIPv4 is a node's IPv4 InternalIP: where its LB host is reached
// on the node network.
func internalIPv4(n *corev1.Node) (netip.Addr, bool) {
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Unmap().Is4() {
			return ip.Unmap(), true
		}
	}
	return netip.Addr{}, false
}
