package lbsync

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// An LB host cut off the API server (its clients and the nodes still reach
// it) serves with what it last knew, and so does its own node's
// kube-proxy, which most likely shares the cut: a pod that moves meanwhile
// is, for that kube-proxy, still where it was. So while the replica counts
// itself cut off, its own node's backends take no new connection of a
// Service whose node ports forward anywhere in the cluster (node mode,
// externalTrafficPolicy Cluster), in each frontend where another node's
// backend is proven working: the other nodes' kube-proxies follow the
// moves. With Local, a node port forwards only to the node's own pods,
// which the cut keeps running (its kubelet is cut off too), so nothing is
// stale there.

// watchCutOff checks CutOff every second until ctx is done. The replica
// counts itself cut off from the first check that says so, and until
// CutOff has said otherwise for CutOffHold: the caches and kube-proxy
// relist a moment after the first write that goes through. Each change
// resyncs. While cut off, the fast path's hold on the host's node is
// dropped (at once, and again whenever the fast path sets one), so that its
// admin state may differ between frontends.
func (s *Syncer) watchCutOff(ctx context.Context, log logr.Logger, gauge prometheus.Gauge) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var reached time.Time // when CutOff last turned false while blind
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cut, blind := s.CutOff(), s.blind.Load()
		switch {
		case cut && !blind:
			s.blind.Store(true)
			gauge.Set(1)
			log.Info("Cut off the API server: serving with what this replica last knew; this node's own kube-proxy is probably as stale, so it takes no new connection of a Service where another node can", "node", s.HostNode, "adminStateDisabled", s.Model.AdminStateDisabled)
			s.DataPlane.ForgetOwnerAdminState(s.HostNode)
			s.kick()
			continue
		case !blind:
			continue
		case cut:
			reached = time.Time{}
		case reached.IsZero():
			reached = time.Now()
		case time.Since(reached) >= s.CutOffHold:
			reached = time.Time{}
			s.blind.Store(false)
			gauge.Set(0)
			log.Info("Reaching the API server again: this node's own backends take new connections again", "node", s.HostNode)
			s.kick()
			continue
		}
		// Still cut off: a hold the fast path put back goes again.
		if s.DataPlane.ForgetOwnerAdminState(s.HostNode) {
			s.kick()
		}
	}
}

// spareOwnNode sets own's backends of svc's frontends admin Down where
// another backend is not Down and is proven working (working), for a
// Service in node mode with externalTrafficPolicy Cluster (see above).
func spareOwnNode(svc *corev1.Service, fes []dataplane.Frontend, own string, working func() map[backendRef]bool) {
	if lbmodel.ModeOf(svc) != lbmodel.NodeMode || svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		return
	}
	for i := range fes {
		fe := &fes[i]
		at, other := -1, false
		for j, b := range fe.Backends {
			switch {
			case b.Owner == own:
				at = j
			case b.AdminState != dataplane.AdminDown && working()[backendRef{fe.Name, b.AddrPort()}]:
				other = true
			}
		}
		if at >= 0 && other {
			fe.Backends = append([]dataplane.Backend(nil), fe.Backends...)
			fe.Backends[at].AdminState = dataplane.AdminDown
		}
	}
}
