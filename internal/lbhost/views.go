package lbhost

import (
	"context"
	"fmt"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// View is what the fresh LoadBalancerReports say about one node: what a
// drain (NodeMaintenance) and a deletion hold wait on.
type View struct {
	// Down: every replica that has backends on the node applies Down, and
	// every replica running on the node (an LB host) is draining.
	Down bool
	// Connections still established through the node, over replicas,
	// those of the replicas running on it included.
	Connections int64
	// HostConnections are the connections of the replicas running on the
	// node; HostServing names those not draining yet.
	HostConnections int64
	HostServing     []string
	// Unknown names the ebb lb pods that run without a fresh report: what
	// they send the node is not known, so a drain waits for them (up to
	// its gate); Down and Connections are what the reports say.
	Unknown []string
	// Reports counts the fresh reports the view sums: with none, Down and
	// no connection say nothing.
	Reports int
}

// ReadViews reads the reports of the `ebb lb` replicas and their pods in
// namespace (DefaultNamespace when empty); stale reports (a replica that
// is gone) are ignored. The `ebb lb` pods that run without a fresh report
// (Unreported) are named in every view.
func ReadViews(ctx context.Context, c client.Reader, namespace string, now metav1.Time) (func(node string) View, error) {
	var list v1alpha1.LoadBalancerReportList
	if err := c.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing LoadBalancerReports: %w", err)
	}
	pods, err := ListPods(ctx, c, namespace)
	if err != nil {
		return nil, err
	}
	var unknown []string
	for _, p := range Unreported(pods, list.Items, now) {
		unknown = append(unknown, p.Name)
	}
	return Views(list.Items, unknown, now), nil
}

// Views sums the fresh reports per node. A node no replica lists has no
// backends: it is Down with no connection.
func Views(reports []v1alpha1.LoadBalancerReport, unknown []string, now metav1.Time) func(node string) View {
	sort.Strings(unknown)
	fresh := 0
	for i := range reports {
		if reports[i].Fresh(now) {
			fresh++
		}
	}
	views := map[string]*View{}
	view := func(node string) *View {
		v, ok := views[node]
		if !ok {
			v = &View{Down: true, Unknown: unknown, Reports: fresh}
			views[node] = v
		}
		return v
	}
	for i := range reports {
		rep := &reports[i]
		if !rep.Fresh(now) {
			continue
		}
		for _, n := range rep.Status.Nodes {
			v := view(n.Name)
			v.Down = v.Down && n.AdminState == v1alpha1.AdminStateDown
			v.Connections += n.Connections
		}
		// The replica's host carries the replica's own connections; it
		// takes no new ones once the replica drains.
		if host := rep.Status.HostNode; host != "" {
			v := view(host)
			v.Connections += rep.Status.Connections
			v.HostConnections += rep.Status.Connections
			if !rep.Status.Draining {
				v.Down = false
				v.HostServing = append(v.HostServing, rep.Name)
			}
		}
	}
	return func(node string) View {
		return *view(node)
	}
}
