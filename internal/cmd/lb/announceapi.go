package lb

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/internal/announce/bgp"
	"github.com/ebbdev/ebb/internal/cmd/kubeconfig"
	"github.com/ebbdev/ebb/internal/lbsync"
)

// defaultSecretNamespace is where BGPPeers' password Secrets are read:
// this pod's namespace ($POD_NAMESPACE, from the downward API), else
// ebb-system.
func defaultSecretNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return "ebb-system"
}

// followBGPPeers peers with the routers of the BGPPeer objects that choose
// this host, until ctx is done. A cluster without the BGPPeer API (ebb's
// CRDs not installed) is logged once and left alone.
func (o *Options) followBGPPeers(ctx context.Context, log logr.Logger, addrs *addressSinks) error {
	cfg, err := kubeconfig.Load(o.Kubeconfig)
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating a discovery client: %w", err)
	}
	if ok, err := servesBGPPeers(dc); err != nil || !ok {
		log.Info("Not reading BGPPeer objects: the API does not serve them (apply ebb's CRDs)", "error", err)
		return nil
	}
	scheme := runtime.NewScheme()
	if err := lbv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	byObject := map[client.Object]ctrlcache.ByObject{
		&corev1.Secret{}: {Namespaces: map[string]ctrlcache.Config{o.BGPSecretNamespace: {}}},
	}
	if o.NodeName != "" {
		byObject[&corev1.Node{}] = ctrlcache.ByObject{Field: fields.OneTermEqualSelector("metadata.name", o.NodeName)}
	}
	c, err := ctrlcache.New(cfg, ctrlcache.Options{Scheme: scheme, ByObject: byObject})
	if err != nil {
		return fmt.Errorf("creating a cache of the BGP peers: %w", err)
	}
	peers := &lbsync.BGPPeers{Cache: c, Node: o.NodeName, Namespace: o.BGPSecretNamespace,
		OnChange: func(peers []bgp.Peer, problems []lbsync.PeerProblem) {
			addrs.setBGPPeers(ctx, log, peers, problems)
		}}
	return peers.Run(ctx)
}

// servesBGPPeers says whether the API serves lb.ebb.dev/v1alpha1 bgppeers.
func servesBGPPeers(dc discovery.DiscoveryInterface) (bool, error) {
	res, err := dc.ServerResourcesForGroupVersion(lbv1alpha1.GroupVersion.String())
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(res.APIResources, func(r metav1.APIResource) bool { return r.Name == "bgppeers" }), nil
}

// setBGPPeers peers with the BGPPeers' routers besides the --bgp-peer
// ones (which win on a shared address); the first of them start the
// speaker when --bgp-asn did not. Problems are reported with the sessions.
func (a *addressSinks) setBGPPeers(ctx context.Context, log logr.Logger, peers []bgp.Peer, problems []lbsync.PeerProblem) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.apiPeers, a.peerProblems = peers, problems
	if a.retired || a.stopping || a.newSpeaker == nil {
		return
	}
	all := slices.Clone(a.flagPeers)
	for _, p := range peers {
		if !slices.ContainsFunc(a.flagPeers, func(f bgp.Peer) bool { return f.Address == p.Address }) {
			all = append(all, p)
		}
	}
	if a.bgp != nil {
		if err := a.bgp.SetPeers(ctx, all); err != nil {
			log.Error(err, "Changing the BGP peers")
		}
		return
	}
	if len(all) == 0 {
		return
	}
	sp, err := a.newSpeaker(ctx, all, a.bgpDeferred)
	if err != nil {
		a.speakerErr = fmt.Sprintf("this host cannot speak BGP: %v", err)
		log.Error(err, "Starting BGP for the BGPPeers")
		return
	}
	a.bgp, a.speakerErr = sp, ""
	if err := a.announceLocked(); err != nil {
		log.Error(err, "Announcing to the BGPPeers")
	}
}
