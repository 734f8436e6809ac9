package bgp

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
)

func TestParsePeer(t *testing.T) {
	tests := []struct {
		in      string
		want    Peer
		wantErr string
	}{
		{in: "10.0.0.253:64500", want: Peer{Address: netip.MustParseAddr("10.0.0.253"), ASN: 64500}},
		{in: "[fd00::1]:4200000000", want: Peer{Address: netip.MustParseAddr("fd00::1"), ASN: 4200000000}},
		{in: "10.0.0.253", wantErr: "want ADDRESS:ASN"},
		{in: "router:64500", wantErr: "is not an IP address"},
		{in: "10.0.0.253:0", wantErr: "is not an AS number"},
		{in: "10.0.0.253:4294967296", wantErr: "is not an AS number"},
	}
	for _, tt := range tests {
		got, err := ParsePeer(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParsePeer(%q) = %v, %v; want an error with %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParsePeer(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}

// routerAddr is where the test's router listens: an address of loopback
// that nothing else uses, on BGP's port (the tests run as root).
const routerAddr = "127.0.79.1"

// startRouter runs a GoBGP server as the speakers' peer: AS 64500,
// passive, accepting IPv4 and IPv6 unicast from 127.0.0.1 (AS 64512), with
// a TCP MD5 password when one is given.
func startRouter(t *testing.T, password string) *server.BgpServer {
	t.Helper()
	return startRouterFor(t, password, 64512)
}

// startRouterFor is startRouter with the speakers' AS number (64500:
// iBGP).
func startRouterFor(t *testing.T, password string, speakerASN uint32) *server.BgpServer {
	t.Helper()
	ctx := context.Background()
	r := listeningRouter(t)
	var afis []*api.AfiSafi
	for _, afi := range []api.Family_Afi{api.Family_AFI_IP, api.Family_AFI_IP6} {
		afis = append(afis, &api.AfiSafi{Config: &api.AfiSafiConfig{Family: &api.Family{Afi: afi, Safi: api.Family_SAFI_UNICAST}, Enabled: true}})
	}
	if err := r.AddPeer(ctx, &api.AddPeerRequest{Peer: &api.Peer{Conf: &api.PeerConf{NeighborAddress: "127.0.0.1", PeerAsn: speakerASN, AuthPassword: password},
		AfiSafis: afis, Transport: &api.Transport{PassiveMode: true}}}); err != nil {
		t.Fatal(err)
	}
	return r
}

// listeningRouter starts the test's router (AS 64500) listening on
// routerAddr, without peers; it stops when the test ends.
func listeningRouter(t *testing.T) *server.BgpServer {
	t.Helper()
	r := server.NewBgpServer()
	go r.Serve()
	t.Cleanup(r.Stop)
	if err := r.StartBgp(context.Background(), &api.StartBgpRequest{Global: &api.Global{Asn: 64500, RouterId: "10.255.0.1", ListenPort: 179, ListenAddresses: []string{routerAddr}}}); err != nil {
		t.Fatal(err)
	}
	return r
}

// routes returns the router's routes of a family and their next hops.
func routes(t *testing.T, r *server.BgpServer, family bgp.Family) map[netip.Prefix]netip.Addr {
	t.Helper()
	out := map[netip.Prefix]netip.Addr{}
	err := r.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: family}, func(nlri bgp.NLRI, paths []*apiutil.Path) {
		p, err := netip.ParsePrefix(nlri.String())
		if err != nil {
			return
		}
		for _, path := range paths {
			for _, a := range path.Attrs {
				switch a := a.(type) {
				case *bgp.PathAttributeNextHop:
					out[p] = a.Value
				case *bgp.PathAttributeMpReachNLRI:
					out[p] = a.Nexthop
				}
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A speaker with an IPv6 next hop announces both families to its router
// over one IPv4 session (MP-BGP), each with its next hop, and withdraws
// what it stops serving; without one, an IPv6 address is refused with
// what to set.
func TestSpeakerAnnouncesBothFamilies(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the test router listens on port 179 (make test runs as root)")
	}
	router := startRouter(t, "")
	log := slog.New(slog.DiscardHandler)
	v4, v6 := netip.MustParseAddr("10.96.240.1"), netip.MustParseAddr("fd00:96::1")
	sp, err := Start(context.Background(), log, Config{ASN: 64512, RouterID: netip.MustParseAddr("10.0.0.1"), NextHopIPv6: netip.MustParseAddr("fd00::1"),
		Peers: []Peer{{Address: netip.MustParseAddr(routerAddr), ASN: 64500, HoldTime: 3 * time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Stop()
	if err := sp.Sync(Routes(v4, v6)); err != nil {
		t.Fatal(err)
	}
	want4 := map[netip.Prefix]netip.Addr{netip.MustParsePrefix("10.96.240.1/32"): netip.MustParseAddr("10.0.0.1")}
	want6 := map[netip.Prefix]netip.Addr{netip.MustParsePrefix("fd00:96::1/128"): netip.MustParseAddr("fd00::1")}
	waitRoutes := func(family bgp.Family, want map[netip.Prefix]netip.Addr) {
		t.Helper()
		waitForRoutes(t, router, family, want)
	}
	waitRoutes(bgp.RF_IPv4_UC, want4)
	waitRoutes(bgp.RF_IPv6_UC, want6)
	if err := sp.Sync(Routes(v4)); err != nil {
		t.Fatal(err)
	}
	waitRoutes(bgp.RF_IPv6_UC, map[netip.Prefix]netip.Addr{})
	waitRoutes(bgp.RF_IPv4_UC, want4)

	plain, err := Start(context.Background(), log, Config{ASN: 64513, RouterID: netip.MustParseAddr("10.0.0.2"), DeferPeers: true})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Stop()
	if err := plain.Sync(Routes(v6)); err == nil || !strings.Contains(err.Error(), "--bgp-next-hop-ipv6") {
		t.Fatalf("an IPv6 address without an IPv6 next hop: %v", err)
	}
	// Said once as an error, kept as refused while it is wanted.
	if err := plain.Sync(Routes(v6)); err != nil {
		t.Fatalf("the same refusal again: %v", err)
	}
	if r := plain.Refused(); len(r) != 1 || !strings.Contains(r[v6], "IPv6 next hop") {
		t.Fatalf("refused %v, want %s", r, v6)
	}
	if err := plain.Sync(nil); err != nil || len(plain.Refused()) != 0 {
		t.Fatalf("no longer wanted: %v, refused %v", err, plain.Refused())
	}
}

// waitForRoutes waits until the router's routes of a family are want.
func waitForRoutes(t *testing.T, router *server.BgpServer, family bgp.Family, want map[netip.Prefix]netip.Addr) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := routes(t, router, family)
		if reflect.DeepEqual(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router's %v routes are %v, want %v", family, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A speaker started without peers (they come from BGPPeer objects later)
// announces to a peer once it is set, with the peer's own local AS number
// and TCP MD5 password; a wrong password keeps the session down and the
// route off the router; a removed peer's session closes.
func TestSetPeersOpensChangesAndClosesSessions(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the test router listens on port 179 (make test runs as root)")
	}
	router := startRouter(t, "s3cret")
	ctx := context.Background()
	sp, err := Start(ctx, slog.New(slog.DiscardHandler), Config{ASN: 65000, RouterID: netip.MustParseAddr("10.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Stop()
	if err := sp.Sync(Routes(netip.MustParseAddr("10.96.240.7"))); err != nil {
		t.Fatal(err)
	}
	peer := Peer{Address: netip.MustParseAddr(routerAddr), ASN: 64500, LocalASN: 64512, Password: "s3cret", HoldTime: 3 * time.Second}
	if err := sp.SetPeers(ctx, []Peer{peer}); err != nil {
		t.Fatal(err)
	}
	announced := map[netip.Prefix]netip.Addr{netip.MustParsePrefix("10.96.240.7/32"): netip.MustParseAddr("10.0.0.1")}
	waitForRoutes(t, router, bgp.RF_IPv4_UC, announced)
	waitForState(t, sp, "established")

	peer.Password = "wrong"
	if err := sp.SetPeers(ctx, []Peer{peer}); err != nil {
		t.Fatal(err)
	}
	waitForRoutes(t, router, bgp.RF_IPv4_UC, map[netip.Prefix]netip.Addr{})
	// Long enough for a session to come up if the password were ignored.
	time.Sleep(3 * time.Second)
	if got := routes(t, router, bgp.RF_IPv4_UC); len(got) != 0 {
		t.Fatalf("with a wrong password, the router has %v", got)
	}
	states, err := sp.Peers(ctx)
	if err != nil || len(states) != 1 || states[0].Established {
		t.Fatalf("with a wrong password, the sessions are %+v, %v; want one, not established", states, err)
	}

	if err := sp.SetPeers(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if states, err := sp.Peers(ctx); err != nil || len(states) != 0 {
		t.Fatalf("without peers, the sessions are %+v, %v", states, err)
	}
}

// waitForState waits until the speaker's only session is in state.
func waitForState(t *testing.T, sp *Speaker, state string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		states, err := sp.Peers(context.Background())
		if err == nil && len(states) == 1 && states[0].State == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sessions are %+v, %v; want one %s", states, err, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A router that sends far more routes than ebb could need (a full table by
// mistake) does not fill the speaker's memory: past MaxReceivedPrefixes the
// session is closed, and the routes received go with it, then opened again
// later (before: every route was kept, and the session stayed up with
// them; with GoBGP's limit alone, it never came back).
func TestARouterSendingAFullTableIsCutOff(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the test router listens on port 179 (make test runs as root)")
	}
	const sent = 5000
	router := startRouter(t, "")
	var paths []*apiutil.Path
	for i := range sent {
		nlri, err := bgp.NewIPAddrPrefix(netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16 + byte(i>>16), byte(i >> 8), byte(i)}), 32))
		if err != nil {
			t.Fatal(err)
		}
		nextHop, err := bgp.NewPathAttributeNextHop(netip.MustParseAddr(routerAddr))
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, &apiutil.Path{Family: bgp.RF_IPv4_UC, Nlri: nlri,
			Attrs: []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP), nextHop}})
	}
	if _, err := router.AddPath(apiutil.AddPathRequest{Paths: paths}); err != nil {
		t.Fatal(err)
	}
	sp, err := Start(context.Background(), slog.New(slog.DiscardHandler), Config{ASN: 64512, RouterID: netip.MustParseAddr("10.0.0.1"),
		Peers: []Peer{{Address: netip.MustParseAddr(routerAddr), ASN: 64500, HoldTime: 3 * time.Second}}, ReopenAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Stop()
	// The session is opened again after ReopenAfter and GoBGP's idle hold
	// time (5 s), and cut off again, since the router keeps sending them:
	// it is cut off more than once. Each cut-off lasts ReopenAfter (GoBGP's
	// PFX_CT admin state), which sampling cannot miss, where the session's
	// being up between two can last less than one sample on a busy
	// machine.
	most, cuts, wasCut := 0, 0, false
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end) && cuts < 2; time.Sleep(20 * time.Millisecond) {
		n := 0
		err := sp.s.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_ADJ_IN, Name: routerAddr, Family: bgp.RF_IPv4_UC},
			func(bgp.NLRI, []*apiutil.Path) { n++ })
		if err == nil {
			most = max(most, n)
		}
		cut := false
		_ = sp.s.ListPeer(context.Background(), &api.ListPeerRequest{}, func(p *api.Peer) {
			cut = cut || p.GetState().GetAdminState() == api.PeerState_ADMIN_STATE_PFX_CT
		})
		if cut && !wasCut {
			cuts++
		}
		wasCut = cut
	}
	if cuts < 2 {
		t.Fatalf("the session with the router was cut off %d time(s) in 30 s, want it opened again after each cut-off (ReopenAfter 1 s) and cut off again", cuts)
	}
	// How many get in before the cut-off depends on how fast the speaker
	// reads compared with how fast it closes (all 5,000, under the race
	// detector): the bound is that the session goes, and its routes with
	// it, and does not stay up with them.
	t.Logf("at most %d routes held at once", most)
}
