package lb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/announce/bgp"
	"github.com/ebbdev/ebb/internal/announce/l2"
	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/lbsync"
	"github.com/ebbdev/ebb/internal/vipaddr"
)

// addresses returns what is told the served addresses after each apply:
// the local routes (unless --local-routes=false), the BGP speaker (with
// --bgp-asn, or once a BGPPeer chooses this host: setBGPPeers) and the L2
// announcer (with --l2-interface). With restarting (a predecessor handed
// over, or left the kernel engine's state) the speaker opens no session
// until connectBGP, since a predecessor may still hold them and none may
// open before the first Sync, and then opens them as a restart's
// (bgp.Config.Restarting).
func (o *Options) addresses(ctx context.Context, log logr.Logger, reg prometheus.Registerer, restarting bool, ports func() []dataplane.ServedPort) (*addressSinks, error) {
	sinks := &addressSinks{ports: ports}
	if o.LocalRoutes {
		t, err := vipaddr.New()
		if err != nil {
			return nil, fmt.Errorf("opening the local routing table (--local-routes=false to manage the addresses yourself): %w", err)
		}
		sinks.local = t
		if o.GuardAddresses {
			// Conntrack runs anyway where the kernel engine's nftables
			// path may serve a frontend: its flows of a removed frontend
			// drain through the guard there.
			tracked := o.Engine != string(dataplane.EngineProxy) && o.KernelPath != string(dataplane.KernelPathEBPF)
			sinks.guard = newAddressGuard(log, ports, tracked)
			if err := reg.Register(sinks.guard); err != nil {
				sinks.close(log)
				return nil, fmt.Errorf("registering the guard's metrics: %w", err)
			}
		} else {
			log.Info("Not guarding the load balancer's addresses (--guard-addresses=false): every service of this host that listens on all addresses is reachable on them")
		}
	} else {
		log.Info("Not adding local routes for the load balancer's addresses (--local-routes=false): configure them on this host, and keep this host's own services off them")
	}
	sinks.bgpDeferred = restarting
	sinks.newSpeaker = func(ctx context.Context, peers []bgp.Peer, deferPeers bool) (*bgp.Speaker, error) {
		cfg := o.BGP
		if cfg.ASN == 0 && len(peers) > 0 {
			// Only BGPPeers: each session has its own local AS number; this
			// one is the speaker's default.
			cfg.ASN = peers[0].LocalASN
		}
		cfg.Peers, cfg.DeferPeers = peers, deferPeers
		// A successor's sessions restart the predecessor's: the routers
		// keep this host's routes until it re-announced them.
		cfg.Restarting = restarting
		sp, err := bgp.Start(ctx, slog.New(logr.ToSlogHandler(log.WithName("bgp"))), cfg)
		if err != nil {
			return nil, err
		}
		if err := reg.Register(sp.Collector()); err != nil {
			sp.Stop()
			return nil, fmt.Errorf("registering BGP metrics: %w", err)
		}
		log.Info("Announcing by BGP", "asn", cfg.ASN, "routerID", cfg.RouterID, "peers", len(peers), "deferred", deferPeers, "restarting", restarting)
		return sp, nil
	}
	if o.BGP.ASN != 0 {
		for _, s := range o.BGPPeers {
			p, err := bgp.ParsePeer(s)
			if err != nil {
				sinks.close(log)
				return nil, err
			}
			p.HoldTime = o.BGPHoldTime
			sinks.flagPeers = append(sinks.flagPeers, p)
		}
		if len(sinks.flagPeers) == 0 && o.ConfigFile != "" {
			sinks.close(log)
			return nil, errors.New("--bgp-asn needs at least one --bgp-peer (BGPPeer objects are read only in cluster mode)")
		}
		sp, err := sinks.newSpeaker(ctx, sinks.flagPeers, restarting)
		if err != nil {
			sinks.close(log)
			return nil, err
		}
		sinks.bgp = sp
	}
	sinks.flagInterfaces = o.L2.Interfaces
	sinks.l2Metrics = &l2Collector{}
	if err := reg.Register(sinks.l2Metrics); err != nil {
		sinks.close(log)
		return nil, fmt.Errorf("registering L2 metrics: %w", err)
	}
	sinks.newL2 = func(interfaces []string) (*l2.Announcer, error) { return o.startL2(ctx, log, interfaces) }
	if len(o.L2.Interfaces) > 0 {
		a, err := sinks.newL2(o.L2.Interfaces)
		if err != nil {
			sinks.close(log)
			return nil, err
		}
		sinks.setL2(a)
	}
	return sinks, nil
}

// l2Collector reports the current L2 announcer's metrics, none while there
// is none: announcers come and go with the AnnouncementPolicies, the
// registration stays. It is an unchecked collector (it describes nothing).
type l2Collector struct{ current atomic.Pointer[l2.Announcer] }

func (c *l2Collector) Describe(chan<- *prometheus.Desc) {}

func (c *l2Collector) Collect(ch chan<- prometheus.Metric) {
	if a := c.current.Load(); a != nil {
		a.Collector().Collect(ch)
	}
}

// setL2 makes a (nil: none) the L2 announcer; a.mu is held (or a is not
// shared yet).
func (a *addressSinks) setL2(l2a *l2.Announcer) {
	a.l2 = l2a
	if l2a != nil && a.l2Keys != nil {
		l2a.SetKeys(a.l2Keys)
	}
	if a.l2Metrics != nil {
		a.l2Metrics.current.Store(l2a)
	}
}

// setL2Keys gives the L2 announcer, and every later one, the keys of its
// heartbeats.
func (a *addressSinks) setL2Keys(k *l2.Keys) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.l2Keys = k
	if a.l2 != nil {
		a.l2.SetKeys(k)
	}
}

// l2Ready reports whether the L2 announcer, if any, has its heartbeat
// keys.
func (a *addressSinks) l2Ready() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.l2 == nil || a.l2.HasKeys()
}

// startL2 starts announcing by ARP and NDP on interfaces: the replicas of
// one class elect an owner per address among themselves.
func (o *Options) startL2(ctx context.Context, log logr.Logger, interfaces []string) (*l2.Announcer, error) {
	cfg := o.L2
	cfg.Interfaces = interfaces
	cfg.Group, cfg.Node = o.LoadBalancerClass, o.NodeName
	if cfg.Node == "" {
		// The host's name, not the pod's: two processes of one host (a
		// hand-off) must be one replica to the others.
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("L2 announcement needs --node-name: %w", err)
		}
		cfg.Node = h
	}
	a, err := l2.Start(ctx, log.WithName("l2"), cfg)
	if err != nil {
		return nil, err
	}
	log.Info("Announcing by ARP and NDP", "interfaces", cfg.Interfaces, "node", cfg.Node, "group", cfg.Group)
	return a, nil
}

// addressSinks makes the served addresses local to this host, then
// announces them; each part is optional. Once handed over to a successor
// (retire), it does nothing more: the routes and announcements are the
// successor's.
type addressSinks struct {
	mu      sync.Mutex
	local   *vipaddr.Table
	bgp     *bgp.Speaker
	l2      *l2.Announcer
	retired bool
	// newSpeaker starts a BGP speaker; the first peers start one when
	// --bgp-asn did not. bgpDeferred: the sessions wait for connectBGP (a
	// predecessor on the host still holds them, or this process restarts).
	newSpeaker  func(ctx context.Context, peers []bgp.Peer, deferPeers bool) (*bgp.Speaker, error)
	bgpDeferred bool
	// flagPeers are --bgp-peer's; apiPeers and peerProblems come from the
	// BGPPeer objects (setBGPPeers); speakerErr is why the speaker the
	// BGPPeers asked for could not start.
	flagPeers    []bgp.Peer
	apiPeers     []bgp.Peer
	peerProblems []lbsync.PeerProblem
	speakerErr   string
	// stopping: the graceful stop withdrew everything for good.
	stopping bool
	// withdrawn: the host is leaving, so nothing is announced, while the
	// sessions and the local routes stay (setWithdrawn).
	withdrawn bool
	// want is the last set of addresses synced; synced: Sync was called.
	want   []netip.Addr
	synced bool
	// plan says which of them are announced how (AnnouncementPolicies).
	plan lbsync.AnnouncementPlan
	// l2Refused: the addresses the L2 announcer refused at the last sync.
	l2Refused map[netip.Addr]string
	// newL2 starts an L2 announcer; AnnouncementPolicies naming
	// interfaces start one when --l2-interface did not (setPlan).
	// flagInterfaces are --l2-interface's.
	newL2          func(interfaces []string) (*l2.Announcer, error)
	flagInterfaces []string
	l2Metrics      *l2Collector
	// l2Keys sign and check the L2 heartbeats (setL2Keys); every L2
	// announcer gets them.
	l2Keys *l2.Keys
	// flows forwards the segments of flows the routers move here (nil:
	// off); it follows the addresses and the withdrawn state.
	flows *movedFlows
	// guard keeps the host's own services off the addresses the local
	// routes cover (nil: off, or no local routes).
	guard *addressGuard
	// ports are the frontends served (DataPlane.Ports), which the guard
	// and the forwarding of moved flows follow.
	ports func() []dataplane.ServedPort
	// withdrawAfter delays the withdrawal when the host starts leaving, so
	// the other LB hosts forward this host's flows before the routers move
	// them; withdrawTimer is that pending withdrawal.
	withdrawAfter time.Duration
	withdrawTimer *time.Timer
}

// Sync makes the host accept want before announcing it, so traffic that the
// announcement attracts finds the address local.
func (a *addressSinks) Sync(want []netip.Addr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.retired {
		return nil
	}
	a.want, a.synced = want, true
	var errs []error
	if a.l2 != nil {
		// Before the routes: a local address would make the kernel
		// answer ARP for it on every interface, against its owner.
		errs = append(errs, a.l2.SetLocal(want))
	}
	if a.local != nil {
		errs = append(errs, a.local.Sync(want))
		errs = append(errs, a.syncGuardLocked())
	}
	if a.ports != nil {
		a.flows.setFrontends(tcpFrontends(a.ports()))
	}
	errs = append(errs, a.announceLocked())
	return errors.Join(errs...)
}

// syncGuardLocked guards the addresses ebb's local routes cover (not those
// the host had of its own: they are someone else's to guard).
func (a *addressSinks) syncGuardLocked() error {
	if a.guard == nil {
		return nil
	}
	owned, err := a.local.Addresses()
	if err != nil {
		return fmt.Errorf("guarding the load balancer's addresses: %w", err)
	}
	if err := a.guard.sync(owned); err != nil {
		return fmt.Errorf("guarding the load balancer's addresses (--guard-addresses=false to do without): %w", err)
	}
	return nil
}

// repairParts are the kernel state of the addresses that someone else
// may take out (a firewall reload runs `nft flush ruleset`): the guard,
// the forwarding of moved flows and the rules that keep the kernel from
// answering ARP for the addresses. Once retired, they are the successor's
// to repair (each part checks).
func (a *addressSinks) repairParts() []repairPart {
	a.mu.Lock()
	defer a.mu.Unlock()
	parts := []repairPart{{"guard", a.guard.repair}, {"flows", a.flows.repair}}
	if a.l2 != nil && !a.retired {
		parts = append(parts, repairPart{"arp", a.l2.Repair})
	}
	return parts
}

// bgpRoutes are the routes of the addresses of want that the plan
// announces by BGP, with the attributes it gives them.
func bgpRoutes(want []netip.Addr, plan lbsync.AnnouncementPlan) []bgp.Route {
	var out []bgp.Route
	for _, addr := range want {
		if plan.BGP(addr) {
			out = append(out, plan.BGPRoute(addr))
		}
	}
	return out
}

// announceLocked announces the wanted addresses as the plan says, or none
// while withdrawn.
func (a *addressSinks) announceLocked() error {
	if !a.synced {
		// Nothing is served yet, and a predecessor on this host may still
		// announce its addresses: an L2 announcer that spoke now would
		// offer nothing for the node as its newest process, and the other
		// hosts would take the addresses away from it (CI: a policy
		// change before a successor's first sync moved an address
		// during a rolling upgrade). The first Sync announces.
		return nil
	}
	want := a.want
	if a.withdrawn || a.stopping {
		want = nil
	}
	var errs []error
	a.l2Refused = nil
	if a.bgp != nil {
		errs = append(errs, a.bgp.Sync(bgpRoutes(want, a.plan)))
		if a.local != nil {
			// The aggregates' addresses this host does not serve are
			// dropped here, not routed back to the router.
			errs = append(errs, a.local.SyncAggregates(a.bgp.Aggregates()))
		}
	}
	if a.l2 != nil {
		offer, only := l2Offer(want, a.plan, a.l2.Interfaces())
		a.l2.Restrict(only)
		if err := a.l2.Sync(offer); err != nil {
			errs = append(errs, err)
			a.l2Refused = map[netip.Addr]string{}
			for _, addr := range offer {
				a.l2Refused[addr] = err.Error()
			}
		}
	}
	return errors.Join(errs...)
}

// Unannounced returns the served addresses that a way of announcing
// meant for them cannot announce now, and why (lbsync reports them on
// their Services).
func (a *addressSinks) Unannounced() map[netip.Addr]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[netip.Addr]string{}
	if a.retired || a.withdrawn || a.stopping {
		return out
	}
	if a.bgp != nil {
		maps.Copy(out, a.bgp.Refused())
	}
	for addr, why := range a.l2Refused {
		if prev, ok := out[addr]; ok {
			why = prev + "; " + why
		}
		out[addr] = why
	}
	return out
}

// setWithdrawn withdraws every announcement while the host is leaving
// (routers move new flows to the other hosts; the sessions stay up, so
// coming back is one update), and announces again when it no longer is.
// The withdrawal waits withdrawAfter, for the other LB hosts to forward
// this host's flows once the routers move them (they watch the same
// Node). The host keeps accepting the addresses for its established
// connections and the stragglers of the routers' convergence: refusing
// them would turn a slow router into failed requests.
func (a *addressSinks) setWithdrawn(log logr.Logger, on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.flows.setDraining(on)
	if a.withdrawTimer != nil {
		a.withdrawTimer.Stop()
		a.withdrawTimer = nil
	}
	apply := func() {
		a.withdrawn = on
		if a.retired {
			return
		}
		if err := a.announceLocked(); err != nil {
			log.Error(err, "Changing the announcements")
		}
	}
	if !on || a.withdrawAfter <= 0 {
		apply()
		return
	}
	a.withdrawTimer = time.AfterFunc(a.withdrawAfter, func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		apply()
	})
}

// bgpWaiting says whether the BGP sessions wait for connectBGP.
func (a *addressSinks) bgpWaiting() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bgpDeferred
}

// connectBGP opens the BGP sessions a deferred speaker has not opened.
func (a *addressSinks) connectBGP(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.bgpDeferred = false
	if a.bgp == nil || a.retired {
		return nil
	}
	return a.bgp.Connect(ctx)
}

// announcing says whether the host announces its addresses now (some
// way of announcing runs, and the host is not withdrawn).
func (a *addressSinks) announcing() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return !a.withdrawn && !a.stopping && !a.retired && (a.bgp != nil || a.l2 != nil)
}

// withdraw stops announcing the addresses (BGP withdraws its routes) and
// reports whether there was anything announced; the host still accepts
// them, for the established connections.
func (a *addressSinks) withdraw() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stopping = true
	announced := false
	if a.bgp != nil {
		a.bgp.Stop()
		a.bgp = nil
		announced = true
	}
	if a.l2 != nil && !a.retired && a.synced {
		// Still heartbeating, offering nothing: the other replicas take
		// the addresses over at once rather than after --l2-dead-after.
		// (Before its first Sync it never spoke for the node: it stays
		// silent, and a predecessor keeps the addresses.)
		_ = a.l2.Sync(nil)
		announced = true
	}
	return announced
}

// retire leaves the addresses to a successor on this host: the BGP
// sessions close without a notification, so routers that negotiated
// graceful restart keep the routes until the successor's speaker
// re-announces them, and the local routes stay.
func (a *addressSinks) retire() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.retired = true
	a.flows.retire()
	a.guard.retire()
	if a.bgp != nil {
		a.bgp.StopForSuccessor()
		a.bgp = nil
	}
	if a.l2 != nil {
		a.l2.StopForSuccessor()
		a.setL2(nil)
	}
}

// close withdraws every announcement, then removes the local routes;
// retired, it only lets go of the routing table.
func (a *addressSinks) close(log logr.Logger) {
	a.withdraw()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.withdrawTimer != nil {
		a.withdrawTimer.Stop()
	}
	a.flows.close()
	if a.local != nil {
		if !a.retired {
			if err := a.local.Sync(nil); err != nil {
				log.Error(err, "Removing the local routes of the load balancer's addresses")
			}
		}
		a.local.Close()
		a.local = nil
	}
	a.guard.close()
	// After the routes: the kernel rules keep it from answering ARP for
	// addresses still local.
	if a.l2 != nil {
		if err := a.l2.Stop(); err != nil {
			log.Error(err, "Stopping the L2 announcement")
		}
		a.setL2(nil)
	}
}

// served is what the report lists as served: the addresses synced (local,
// each with an open frontend) that reach this host, i.e. that it
// announces wherever the plan says to announce them: by BGP only with an
// established session (not while the speaker the peers ask for has not
// started or failed), by L2 only as the address's owner. An address
// announced no way is served once local (its routes are someone else's).
// None while the host is withdrawn, stopping or retired: the controller
// must not publish an address on the strength of a leaving replica.
func (a *addressSinks) served() []string {
	a.mu.Lock()
	speaker, l2a := a.bgp, a.l2
	if a.retired || a.withdrawn || a.stopping || !a.synced {
		a.mu.Unlock()
		return nil
	}
	want, plan := slices.Clone(a.want), a.plan
	// BGP is meant for this host when a speaker runs, BGPPeers or
	// --bgp-peer name peers for it (a speaker that failed or has not
	// started yet announces nothing), or AnnouncementPolicies say BGP.
	bgpMeant := speaker != nil || len(a.flagPeers)+len(a.apiPeers) > 0 || a.speakerErr != "" || plan.Policies
	var l2Wanted map[netip.Addr]bool
	if l2a != nil {
		offer, _ := l2Offer(want, plan, l2a.Interfaces())
		l2Wanted = make(map[netip.Addr]bool, len(offer))
		for _, addr := range offer {
			l2Wanted[addr] = true
		}
	}
	a.mu.Unlock()
	var owned map[netip.Addr]bool
	if l2a != nil {
		owned = setOf(l2a.Owned())
	}
	var announced map[netip.Addr]bool
	if speaker != nil && bgpEstablished(speaker) {
		announced = setOf(speaker.Announced())
	}
	out := make([]string, 0, len(want))
	for _, addr := range want {
		byBGP, byL2 := bgpMeant && plan.BGP(addr), l2Wanted[addr]
		if (!byBGP && !byL2) || (byBGP && announced[addr]) || (byL2 && owned[addr]) {
			out = append(out, addr.String())
		}
	}
	slices.Sort(out)
	return out
}

// bgpEstablished says whether one of the speaker's sessions is established.
func bgpEstablished(speaker *bgp.Speaker) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	peers, err := speaker.Peers(ctx)
	return err == nil && slices.ContainsFunc(peers, func(p bgp.PeerState) bool { return p.Established })
}

func setOf(addrs []netip.Addr) map[netip.Addr]bool {
	out := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		out[a] = true
	}
	return out
}

// announcement is what the report says of the announcements: the L2
// addresses owned, the BGP routes and sessions, and the BGPPeers that
// cannot be peered with (nil: none of them runs).
func (a *addressSinks) announcement() *v1alpha1.Announcement {
	a.mu.Lock()
	speaker, l2a := a.bgp, a.l2
	var failed []v1alpha1.BGPSession
	for _, p := range a.peerProblems {
		failed = append(failed, v1alpha1.BGPSession{Address: p.Address.String(), State: lbv1alpha1.SessionError, Message: p.Message})
	}
	if speaker == nil && a.speakerErr != "" {
		for _, p := range a.apiPeers {
			failed = append(failed, v1alpha1.BGPSession{Address: p.Address.String(), State: lbv1alpha1.SessionError, Message: a.speakerErr})
		}
	}
	a.mu.Unlock()
	if speaker == nil && l2a == nil && len(failed) == 0 {
		return nil
	}
	out := &v1alpha1.Announcement{BGPPeers: failed}
	if l2a != nil {
		for _, addr := range l2a.Owned() {
			out.L2Owned = append(out.L2Owned, addr.String())
		}
	}
	if speaker != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if peers, err := speaker.Peers(ctx); err == nil {
			for _, p := range peers {
				out.BGPPeers = append(out.BGPPeers, v1alpha1.BGPSession{Address: p.Address.String(), State: p.State})
			}
			// Routes with no session to carry them are announced to no one.
			if len(peers) > 0 {
				for _, addr := range speaker.Announced() {
					out.BGPAnnounced = append(out.BGPAnnounced, addr.String())
				}
			}
		}
	}
	slices.SortFunc(out.BGPPeers, func(x, y v1alpha1.BGPSession) int { return strings.Compare(x.Address, y.Address) })
	return out
}
