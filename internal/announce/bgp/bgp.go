// Package bgp announces the load-balancer addresses a host serves to its
// BGP peers (routers), one host route each (/32, /128) with this host as
// the next hop, and withdraws each the moment the host stops serving it.
// Several hosts announcing one address let the router spread flows across
// them by ECMP. It embeds GoBGP (github.com/osrg/gobgp/v4) as a library:
// the speaker only originates routes; what the peers send is never used.
package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
)

// Peer is one BGP neighbour. Peers are compared with ==: a peer whose
// settings change is a new session.
type Peer struct {
	Address netip.Addr
	ASN     uint32
	// LocalASN is this host's AS number on the session (0: Config.ASN).
	LocalASN uint32
	// Port defaults to 179.
	Port uint16
	// HoldTime defaults to 90 s, KeepaliveTime to a third of it (RFC 4271's
	// suggestion). A peer's hold time bounds how long a dead host keeps
	// receiving traffic when it cannot withdraw its routes itself.
	HoldTime      time.Duration
	KeepaliveTime time.Duration
	// Password is the session's TCP MD5 password (RFC 2385); empty: none.
	Password string
	// NoGracefulRestart leaves graceful restart out of this session even
	// when Config.GracefulRestartTime is set.
	NoGracefulRestart bool
}

// ParsePeer reads a peer as ADDRESS:ASN, e.g. 10.0.0.253:64500 or
// [fd00::1]:64500.
func ParsePeer(s string) (Peer, error) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return Peer{}, fmt.Errorf("BGP peer %q: want ADDRESS:ASN, e.g. 10.0.0.253:64500", s)
	}
	addr, err := netip.ParseAddr(strings.Trim(s[:i], "[]"))
	if err != nil {
		return Peer{}, fmt.Errorf("BGP peer %q: %q is not an IP address", s, s[:i])
	}
	asn, err := strconv.ParseUint(s[i+1:], 10, 32)
	if err != nil || asn == 0 {
		return Peer{}, fmt.Errorf("BGP peer %q: %q is not an AS number (1 to 4294967295)", s, s[i+1:])
	}
	return Peer{Address: addr, ASN: uint32(asn)}, nil
}

// Config configures a Speaker.
type Config struct {
	// ASN is this host's AS number.
	ASN uint32
	// RouterID is this host's BGP identifier, and the next hop of its IPv4
	// routes: an IPv4 address of this host that the peers reach.
	RouterID netip.Addr
	// NextHopIPv6 is the next hop of its IPv6 routes: an IPv6 address of
	// this host that the peers reach. Unset, IPv6 addresses are not
	// announced; set, every session carries IPv6 unicast too (MP-BGP, RFC
	// 4760, over whichever family the session uses).
	NextHopIPv6 netip.Addr
	Peers       []Peer
	// GracefulRestartTime, when set, negotiates graceful restart (RFC
	// 4724) with every peer: when the session ends without a notification
	// (StopForSuccessor, a crash), the peers keep this host's routes for
	// this long while a new speaker on the same host opens the session
	// again and re-announces them. It is what lets a successor process take
	// over the host's announcements without its routes leaving the
	// routers in between.
	GracefulRestartTime time.Duration
	// DeferPeers starts the speaker without sessions: Connect opens them
	// (a successor waits until its predecessor on the host closed its own,
	// since a router keeps one session per neighbour address).
	DeferPeers bool
	// Restarting opens the sessions as a restarting speaker's (RFC 4724
	// section 4.1): a successor whose predecessor on this host closed its
	// sessions for graceful restart, or one that found the kernel
	// engine's tables an ebb lb that crashed left, the host's forwarding
	// state kept. The OPEN then says so (the Restart State bit, and the
	// Forwarding State bit of each family), and a router keeps the routes
	// it held for this host as stale until this speaker's End-of-RIB
	// replaces them. Without it a router removes the
	// stale routes at the OPEN (RFC 4724 section 4.2: FRR does) and adds
	// them back at the first UPDATE: for that moment its ECMP sends this
	// host's connections to the other LB hosts, which reset them. The
	// speaker sends its routes once every peer's End-of-RIB came, or after
	// GracefulRestartTime (at most 15 s). It applies to the sessions opened
	// within GracefulRestartTime of Connect, while the routers may still
	// hold routes of this host (a BGPPeer read a moment after the others
	// is one of them); later sessions are ordinary. Needs
	// GracefulRestartTime.
	Restarting bool
	// ReopenAfter is how long a session closed for sending more than
	// MaxReceivedPrefixes routes stays closed before it is opened again.
	// Default: 30 s.
	ReopenAfter time.Duration
}

// Speaker is a BGP speaker that announces a set of addresses.
type Speaker struct {
	s   *server.BgpServer
	cfg Config
	// stopped ends the reopening of cut-off sessions.
	stopped chan struct{}
	stop    sync.Once

	mu        sync.Mutex
	connected bool
	// restartUntil: sessions opened before then open as a restarting
	// speaker's (Config.Restarting; set at the first Connect).
	restartUntil time.Time
	// sessions are the peers added to the server (after Connect).
	sessions  map[netip.Addr]Peer
	announced map[netip.Prefix]announcement
	// addrs are the addresses whose routes are announced, and each one's
	// route (its host route or an aggregate holding it).
	addrs map[netip.Addr]netip.Prefix
	// refused holds the wanted addresses that cannot be announced, and
	// why; each is returned as an error once, not at every sync.
	refused map[netip.Addr]string
}

// Start starts a speaker and its sessions; it does not listen on port 179
// (it connects to its peers).
func Start(ctx context.Context, log *slog.Logger, cfg Config) (*Speaker, error) {
	if cfg.ASN == 0 {
		return nil, errors.New("BGP: a local AS number is required")
	}
	if !cfg.RouterID.Is4() {
		return nil, fmt.Errorf("BGP: the router ID %q must be an IPv4 address of this host", cfg.RouterID)
	}
	if cfg.NextHopIPv6.IsValid() && (!cfg.NextHopIPv6.Is6() || cfg.NextHopIPv6.Is4In6()) {
		return nil, fmt.Errorf("BGP: the IPv6 next hop %q must be an IPv6 address of this host", cfg.NextHopIPv6)
	}
	level := &slog.LevelVar{}
	level.Set(slog.LevelWarn)
	s := server.NewBgpServer(server.LoggerOption(log, level))
	go s.Serve()
	if cfg.ReopenAfter <= 0 {
		cfg.ReopenAfter = 30 * time.Second
	}
	sp := &Speaker{s: s, cfg: cfg, stopped: make(chan struct{}), sessions: map[netip.Addr]Peer{}, announced: map[netip.Prefix]announcement{}, addrs: map[netip.Addr]netip.Prefix{}, refused: map[netip.Addr]string{}}
	err := s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn: cfg.ASN, RouterId: cfg.RouterID.String(), ListenPort: -1,
	}})
	if err != nil {
		s.Stop()
		return nil, fmt.Errorf("starting BGP: %w", err)
	}
	if !cfg.DeferPeers {
		if err := sp.Connect(ctx); err != nil {
			s.Stop()
			return nil, err
		}
	}
	go sp.reopenCutOff(log)
	return sp, nil
}

// reopenCutOff opens again, every ReopenAfter, the sessions GoBGP closed
// for their peer's sending more than MaxReceivedPrefixes routes: GoBGP
// keeps such a peer administratively down (PFX_CT) for good, which would
// take this host's routes off that router until ebb lb restarted.
func (sp *Speaker) reopenCutOff(log *slog.Logger) {
	t := time.NewTicker(sp.cfg.ReopenAfter)
	defer t.Stop()
	for {
		select {
		case <-sp.stopped:
			return
		case <-t.C:
		}
		var cut []string
		_ = sp.s.ListPeer(context.Background(), &api.ListPeerRequest{}, func(p *api.Peer) {
			if p.GetState().GetAdminState() == api.PeerState_ADMIN_STATE_PFX_CT {
				cut = append(cut, p.GetConf().GetNeighborAddress())
			}
		})
		for _, addr := range cut {
			log.Warn("BGP: opening again a session closed for the peer's sending more routes than ebb accepts", "peer", addr, "max", MaxReceivedPrefixes)
			if err := sp.s.EnablePeer(context.Background(), &api.EnablePeerRequest{Address: addr}); err != nil {
				log.Warn("BGP: opening a cut-off session again", "peer", addr, "err", err)
			}
		}
	}
}

// Connect opens the sessions with the peers (see Config.DeferPeers); the
// addresses synced so far are announced on each once it is established.
func (sp *Speaker) Connect(ctx context.Context) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if !sp.connected && sp.cfg.Restarting {
		sp.restartUntil = time.Now().Add(sp.cfg.GracefulRestartTime)
	}
	sp.connected = true
	return sp.syncPeersLocked(ctx)
}

// SetPeers changes the peers: sessions with new peers open, sessions with
// peers no longer wanted close, and a peer whose settings changed gets a
// new session. Before Connect it only records them.
func (sp *Speaker) SetPeers(ctx context.Context, peers []Peer) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.cfg.Peers = slices.Clone(peers)
	if !sp.connected {
		return nil
	}
	return sp.syncPeersLocked(ctx)
}

// syncPeersLocked makes the server's sessions those of cfg.Peers.
func (sp *Speaker) syncPeersLocked(ctx context.Context) error {
	// Routes the peers send are kept in GoBGP's table and used for nothing
	// (no kernel or zebra integration). They cannot be refused with GoBGP's
	// global import policy: it applies to this speaker's own routes too.
	want := map[netip.Addr]Peer{}
	for _, p := range sp.cfg.Peers {
		want[p.Address] = p
	}
	var errs []error
	for addr, have := range sp.sessions {
		if p, ok := want[addr]; ok && p == have {
			continue
		}
		if err := sp.s.DeletePeer(ctx, &api.DeletePeerRequest{Address: addr.String()}); err != nil {
			errs = append(errs, fmt.Errorf("removing BGP peer %s: %w", addr, err))
			continue
		}
		delete(sp.sessions, addr)
	}
	restarting := time.Now().Before(sp.restartUntil)
	for addr, p := range want {
		if _, ok := sp.sessions[addr]; ok {
			continue
		}
		peer := apiPeer(p, sp.cfg.GracefulRestartTime, sp.cfg.NextHopIPv6.IsValid())
		if restarting && peer.GracefulRestart != nil {
			peer.GracefulRestart.LocalRestarting = true
			// GoBGP's default is 360 s: a peer that is down or never
			// sends its End-of-RIB would keep this host's routes unsent
			// to every peer that long (the routers keep the stale ones
			// meanwhile; only a change waits).
			peer.GracefulRestart.DeferralTime = min(peer.GracefulRestart.RestartTime, maxRestartDeferral)
		}
		if err := sp.s.AddPeer(ctx, &api.AddPeerRequest{Peer: peer}); err != nil {
			errs = append(errs, fmt.Errorf("adding BGP peer %s: %w", addr, err))
			continue
		}
		sp.sessions[addr] = p
	}
	return errors.Join(errs...)
}

func apiPeer(p Peer, gracefulRestart time.Duration, ipv6 bool) *api.Peer {
	hold := p.HoldTime
	if hold == 0 {
		hold = 90 * time.Second
	}
	keepalive := p.KeepaliveTime
	if keepalive == 0 {
		keepalive = hold / 3
	}
	port := uint32(p.Port)
	if port == 0 {
		port = 179
	}
	if p.NoGracefulRestart {
		gracefulRestart = 0
	}
	peer := &api.Peer{
		Conf: &api.PeerConf{NeighborAddress: p.Address.String(), PeerAsn: p.ASN, LocalAsn: p.LocalASN, AuthPassword: p.Password},
		Timers: &api.Timers{Config: &api.TimersConfig{
			HoldTime: uint64(hold / time.Second), KeepaliveInterval: uint64(keepalive / time.Second), ConnectRetry: 1,
		}},
		Transport: &api.Transport{RemotePort: port},
	}
	afis := []api.Family_Afi{api.Family_AFI_IP}
	if ipv6 {
		afis = append(afis, api.Family_AFI_IP6)
	}
	if gracefulRestart > 0 {
		peer.GracefulRestart = &api.GracefulRestart{Enabled: true, RestartTime: uint32(max(gracefulRestart/time.Second, 1))}
	}
	for _, afi := range afis {
		family := &api.Family{Afi: afi, Safi: api.Family_SAFI_UNICAST}
		as := &api.AfiSafi{Config: &api.AfiSafiConfig{Family: family, Enabled: true},
			PrefixLimits: &api.PrefixLimit{Family: family, MaxPrefixes: MaxReceivedPrefixes, ShutdownThresholdPct: 80}}
		if gracefulRestart > 0 {
			as.MpGracefulRestart = &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}
		}
		peer.AfiSafis = append(peer.AfiSafis, as)
	}
	return peer
}

// maxRestartDeferral bounds, in seconds, how long a restarting speaker
// waits for its peers' End-of-RIB before it sends its routes.
const maxRestartDeferral = 15

// MaxReceivedPrefixes bounds the routes a peer may send in each family.
// ebb announces and learns nothing, but GoBGP keeps every route received
// (Adj-RIB-In): a router that sends a full table (a million routes) would
// run ebb lb out of memory on every host peering with it. Past the limit
// the session is closed with a notification (Cease, maximum number of
// prefixes reached) and opened again after Config.ReopenAfter (30 s), as
// a router's maximum-prefix with a restart timer does; GoBGP logs a
// warning at 80 %.
const MaxReceivedPrefixes = 1000

// announcement is a route announced: its path's id in GoBGP and the
// attributes it carries.
type announcement struct {
	id    uuid.UUID
	attrs Attributes
}

// Sync announces exactly the routes of want: new ones are announced,
// ones whose attributes changed announced again (the router replaces the
// route, with no withdrawal between), ones no longer wanted withdrawn.
// Addresses that share an aggregate share one route, which carries the
// attributes of all of them. IPv6 addresses need an IPv6 next hop
// (Config.NextHopIPv6): without one, each is returned as an error the
// first time it is seen, and the others are announced. An address given
// twice takes its first route.
func (sp *Speaker) Sync(want []Route) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	byAddr := map[netip.Addr]netip.Prefix{}
	prefixes := map[netip.Prefix]Attributes{}
	refused := map[netip.Addr]string{}
	var errs []error
	for _, r := range want {
		a := r.Addr.Unmap()
		if _, seen := byAddr[a]; seen || refused[a] != "" {
			continue
		}
		if a.Is6() && !sp.cfg.NextHopIPv6.IsValid() {
			why := "BGP: IPv6 routes need an IPv6 next hop (ebb lb --bgp-next-hop-ipv6, or an IPv6 address in $NODE_IPS)"
			if _, before := sp.refused[a]; !before {
				errs = append(errs, fmt.Errorf("not announcing %s: %s", a, why))
			}
			refused[a] = why
			continue
		}
		p := r.prefix()
		byAddr[a] = p
		prefixes[p] = prefixes[p].Merge(r.Attrs)
	}
	// keep are announced prefixes no longer wanted that still carry an
	// address whose new route failed: withdrawing them would leave the
	// address unannounced (a move between its host route and an
	// aggregate).
	keep := map[netip.Prefix]bool{}
	for p, attrs := range prefixes {
		if was, ok := sp.announced[p]; ok && was.attrs.Equal(attrs) {
			continue
		}
		id, err := sp.add(p, attrs)
		if err != nil {
			errs = append(errs, err)
			if _, ok := sp.announced[p]; ok {
				// Its route stays, with the attributes it had: the
				// addresses are still announced, not refused.
				continue
			}
			for a, ap := range byAddr {
				if ap != p {
					continue
				}
				if old, ok := sp.addrs[a]; ok && old != p {
					keep[old] = true
					byAddr[a] = old
					continue
				}
				refused[a] = err.Error()
			}
			continue
		}
		sp.announced[p] = announcement{id: id, attrs: attrs}
	}
	sp.refused = refused
	for p, was := range sp.announced {
		if _, ok := prefixes[p]; ok || keep[p] {
			continue
		}
		if err := sp.s.DeletePath(apiutil.DeletePathRequest{UUIDs: []uuid.UUID{was.id}}); err != nil {
			errs = append(errs, fmt.Errorf("BGP: withdrawing %s: %w", p, err))
			continue
		}
		delete(sp.announced, p)
	}
	// An address counts as announced while its route is (a failed
	// re-announcement leaves the earlier one).
	sp.addrs = map[netip.Addr]netip.Prefix{}
	for a, p := range byAddr {
		if _, ok := sp.announced[p]; ok {
			sp.addrs[a] = p
		}
	}
	return errors.Join(errs...)
}

// add announces the route of p with attrs; a route of p announced
// before is replaced (GoBGP keys a local path by its prefix).
func (sp *Speaker) add(p netip.Prefix, attrs Attributes) (uuid.UUID, error) {
	a := p.Addr()
	nlri, err := bgp.NewIPAddrPrefix(p)
	if err != nil {
		return uuid.UUID{}, fmt.Errorf("BGP: the route of %s: %w", p, err)
	}
	path := &apiutil.Path{Family: bgp.RF_IPv4_UC, Nlri: nlri}
	origin := bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)
	if a.Is4() {
		nextHop, err := bgp.NewPathAttributeNextHop(sp.cfg.RouterID)
		if err != nil {
			return uuid.UUID{}, fmt.Errorf("BGP: next hop %s: %w", sp.cfg.RouterID, err)
		}
		path.Attrs = []bgp.PathAttributeInterface{origin, nextHop}
	} else {
		// IPv6 routes travel in MP_REACH_NLRI, which carries the next hop.
		path.Family = bgp.RF_IPv6_UC
		reach, err := bgp.NewPathAttributeMpReachNLRI(bgp.RF_IPv6_UC, []bgp.PathNLRI{{NLRI: nlri}}, sp.cfg.NextHopIPv6)
		if err != nil {
			return uuid.UUID{}, fmt.Errorf("BGP: the route of %s via %s: %w", a, sp.cfg.NextHopIPv6, err)
		}
		path.Attrs = []bgp.PathAttributeInterface{origin, reach}
	}
	path.Attrs = append(path.Attrs, attrs.pathAttributes()...)
	resp, err := sp.s.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{path}})
	if err != nil {
		return uuid.UUID{}, fmt.Errorf("BGP: announcing %s: %w", a, err)
	}
	return resp[0].UUID, nil
}

// Refused returns the addresses of the last Sync that cannot be
// announced, and why.
func (sp *Speaker) Refused() map[netip.Addr]string {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return maps.Clone(sp.refused)
}

// Announced returns the addresses whose routes are announced now,
// sorted.
func (sp *Speaker) Announced() []netip.Addr {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	out := make([]netip.Addr, 0, len(sp.addrs))
	for a := range sp.addrs {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// Aggregates returns the announced routes that are aggregates (shorter
// than a host route), sorted: the host must drop the traffic of their
// addresses it does not serve (vipaddr.Table.SyncAggregates).
func (sp *Speaker) Aggregates() []netip.Prefix {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	var out []netip.Prefix
	for p := range sp.announced {
		if p.Bits() < p.Addr().BitLen() {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

// AnnouncedRoutes counts the routes announced now (host routes and
// aggregates).
func (sp *Speaker) AnnouncedRoutes() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return len(sp.announced)
}

// PeerState is one session's state.
type PeerState struct {
	Address     netip.Addr
	Established bool
	// State is the BGP finite-state machine's state, e.g. "established",
	// "active", "idle".
	State string
}

// Peers returns the state of every session.
func (sp *Speaker) Peers(ctx context.Context) ([]PeerState, error) {
	var out []PeerState
	err := sp.s.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) {
		addr, _ := netip.ParseAddr(p.GetConf().GetNeighborAddress())
		state := p.GetState().GetSessionState()
		out = append(out, PeerState{
			Address:     addr,
			Established: state == api.PeerState_SESSION_STATE_ESTABLISHED,
			State:       strings.ToLower(strings.TrimPrefix(state.String(), "SESSION_STATE_")),
		})
	})
	if err != nil {
		return nil, fmt.Errorf("listing BGP peers: %w", err)
	}
	return out, nil
}

// Stop closes the sessions with a notification (the peers drop every
// route at once, as on a withdrawal) and stops the speaker.
func (sp *Speaker) Stop() {
	sp.stop.Do(func() { close(sp.stopped) })
	_ = sp.s.StopBgp(context.Background(), &api.StopBgpRequest{})
	sp.s.Stop()
}

// StopForSuccessor closes the sessions without a notification, so that
// peers which negotiated graceful restart keep this host's routes until a
// successor's speaker re-announces them (or the restart time passes); it
// is Stop without graceful restart.
func (sp *Speaker) StopForSuccessor() {
	sp.stop.Do(func() { close(sp.stopped) })
	_ = sp.s.StopBgp(context.Background(), &api.StopBgpRequest{AllowGracefulRestart: true})
	sp.s.Stop()
}
