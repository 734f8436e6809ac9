package lb

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/internal/addrrange"
	"github.com/ebbdev/ebb/internal/announce/bgp"
	"github.com/ebbdev/ebb/internal/cmd/kubeconfig"
	"github.com/ebbdev/ebb/internal/lbsync"
)

// followAnnouncementAPI follows the lb.ebb.dev objects that decide how
// this host announces, until ctx is done: the BGPPeers that choose it
// (peered with, passwords from Secrets), the AnnouncementPolicies
// (which addresses by BGP, which by L2) and the AddressPools (whose
// addresses alone the syncer serves, lbsync.SkipOutsidePools). Until the
// API serves them (ebb's CRDs not installed yet), it looks again every
// 30 s.
func (o *Options) followAnnouncementAPI(ctx context.Context, log logr.Logger, addrs *addressSinks, syncer *lbsync.Syncer) error {
	cfg, err := kubeconfig.Load(o.Kubeconfig)
	if err != nil {
		return err
	}
	flagPools, err := o.vipRanges()
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating a discovery client: %w", err)
	}
	// The CRDs may come after ebb lb (applied later, or not yet
	// established): look again now and then.
	logged := false
	err = wait.PollUntilContextCancel(ctx, 30*time.Second, true, func(context.Context) (bool, error) {
		served, err := servedResources(dc)
		ok := err == nil && served["bgppeers"] && served["announcementpolicies"]
		if !ok && !logged {
			logged = true
			log.Info("Not reading BGPPeers and AnnouncementPolicies until the API serves them (apply ebb's CRDs)", "error", err)
		}
		return ok, nil
	})
	if err != nil {
		return nil // stopped before the API served them
	}
	scheme := runtime.NewScheme()
	if err := lbv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := ctrlcache.New(cfg, ctrlcache.Options{Scheme: scheme, ByObject: cacheScope(o.BGPSecretNamespace, o.NodeName)})
	if err != nil {
		return fmt.Errorf("creating a cache of the announcement objects: %w", err)
	}
	go func() { _ = c.Start(ctx) }()
	policies := &lbsync.AnnouncementPolicies{Cache: c, Node: o.NodeName, OnChange: func(plan lbsync.AnnouncementPlan) {
		addrs.setPlan(log, plan)
	}}
	errs := make(chan error, 3)
	go func() { errs <- policies.Run(ctx) }()
	go func() { errs <- syncer.FollowPools(ctx, c, flagPools) }()
	if o.BGPPeersFromAPI {
		direct, err := client.New(cfg, client.Options{Scheme: scheme})
		if err != nil {
			return fmt.Errorf("creating a client for the password Secrets: %w", err)
		}
		peers := &lbsync.BGPPeers{Cache: c, Direct: direct, Node: o.NodeName, Namespace: o.BGPSecretNamespace,
			OnChange: func(peers []bgp.Peer, problems []lbsync.PeerProblem) {
				addrs.setBGPPeers(ctx, log, peers, problems)
			}}
		go func() { errs <- peers.Run(ctx) }()
	} else {
		errs <- nil
	}
	return errors.Join(<-errs, <-errs, <-errs)
}

// cacheScope limits what ebb lb's cache of the announcement objects holds:
// of Secrets, only those labeled as BGP passwords in their namespace (not
// the webhook's CA key or a cloud credential beside them); of Nodes, its
// own.
func cacheScope(secretNamespace, node string) map[client.Object]ctrlcache.ByObject {
	byObject := map[client.Object]ctrlcache.ByObject{
		&corev1.Secret{}: {
			Namespaces: map[string]ctrlcache.Config{secretNamespace: {}},
			Label:      labels.SelectorFromSet(labels.Set{lbv1alpha1.PasswordSecretLabel: "true"}),
		},
	}
	if node != "" {
		byObject[&corev1.Node{}] = ctrlcache.ByObject{Field: fields.OneTermEqualSelector("metadata.name", node)}
	}
	return byObject
}

// vipRanges are the --vip-pool CIDRs, parsed (Run checks them before
// anything starts).
func (o *Options) vipRanges() ([]addrrange.Range, error) {
	var out []addrrange.Range
	for _, p := range o.VIPPools {
		r, err := addrrange.Parse(p)
		if err != nil {
			return nil, fmt.Errorf("--vip-pool %q: %w", p, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// servedResources are the resources the API serves in lb.ebb.dev/v1alpha1.
func servedResources(dc discovery.DiscoveryInterface) (map[string]bool, error) {
	res, err := dc.ServerResourcesForGroupVersion(lbv1alpha1.GroupVersion.String())
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, r := range res.APIResources {
		out[r.Name] = true
	}
	return out, nil
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

// setPlan changes which addresses are announced how (AnnouncementPolicies)
// and on which interfaces L2 runs: --l2-interface's and those the
// policies choosing this host name (the first of them start L2 when the
// flag did not).
func (a *addressSinks) setPlan(log logr.Logger, plan lbsync.AnnouncementPlan) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.plan = plan
	if a.retired || a.stopping {
		return
	}
	ifaces := slices.Clone(a.flagInterfaces)
	for _, n := range plan.L2Interfaces() {
		if !slices.Contains(ifaces, n) {
			ifaces = append(ifaces, n)
		}
	}
	switch {
	case a.l2 == nil && len(ifaces) > 0 && a.newL2 != nil:
		l2a, err := a.newL2(ifaces)
		if err != nil {
			log.Error(err, "Starting L2 announcement for the AnnouncementPolicies", "interfaces", ifaces)
			break
		}
		a.setL2(l2a)
		// Before announcing: the kernel must not answer ARP for the
		// addresses that are local already. Before the first Sync, the
		// kernel rules are left as they are (a predecessor's), and that
		// Sync sets them.
		if a.synced {
			if err := a.l2.SetLocal(a.want); err != nil {
				log.Error(err, "Keeping the kernel from answering ARP for the load-balancer addresses")
			}
		}
	case a.l2 != nil && len(ifaces) == 0:
		// No interface left: no L2 at all (the other hosts take this
		// one's addresses; the kernel answers ARP for them again, as on a
		// host that never announced by L2).
		log.Info("No L2 interface left: stopping L2 announcement")
		if err := a.l2.Stop(); err != nil {
			log.Error(err, "Stopping the L2 announcement")
		}
		a.setL2(nil)
	case a.l2 != nil && !sameSet(a.l2.Interfaces(), ifaces):
		if err := a.l2.SetInterfaces(ifaces); err != nil {
			log.Error(err, "Changing the L2 interfaces", "interfaces", ifaces)
		}
	}
	if err := a.announceLocked(); err != nil {
		log.Error(err, "Changing the announcements")
	}
}

// l2Offer is what the L2 announcer offers of want under plan, and on which
// of its interfaces each address is limited to (absent: all of them). An
// address whose policies name none of its interfaces is not offered.
func l2Offer(want []netip.Addr, plan lbsync.AnnouncementPlan, open []string) ([]netip.Addr, map[netip.Addr][]string) {
	var offer []netip.Addr
	only := map[netip.Addr][]string{}
	for _, addr := range want {
		ok, ifaces := plan.L2(addr)
		if !ok {
			continue
		}
		if ifaces == nil {
			offer = append(offer, addr)
			continue
		}
		var on []string
		for _, name := range ifaces {
			if slices.Contains(open, name) {
				on = append(on, name)
			}
		}
		if len(on) > 0 {
			offer = append(offer, addr)
			only[addr] = on
		}
	}
	return offer, only
}

// sameSet says whether a and b hold the same names, in any order (the
// announcer lists its interfaces in the order they were opened).
func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}
