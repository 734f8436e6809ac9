package bgp

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
)

// startGracefulRouter is startRouter with graceful restart negotiated (as
// a helper): it keeps a restarting speaker's routes and sends its
// End-of-RIB.
func startGracefulRouter(t *testing.T) *server.BgpServer {
	t.Helper()
	r := listeningRouter(t)
	family := &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
	afi := &api.AfiSafi{Config: &api.AfiSafiConfig{Family: family, Enabled: true},
		MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}}
	if err := r.AddPeer(context.Background(), &api.AddPeerRequest{Peer: &api.Peer{Conf: &api.PeerConf{NeighborAddress: "127.0.0.1", PeerAsn: 64512},
		GracefulRestart: &api.GracefulRestart{Enabled: true, HelperOnly: true, RestartTime: 15},
		AfiSafis:        []*api.AfiSafi{afi}, Transport: &api.Transport{PassiveMode: true}}}); err != nil {
		t.Fatal(err)
	}
	return r
}

// restartCapability is the graceful restart capability of the speaker's
// last OPEN, as the router received it (nil before a session).
func restartCapability(t *testing.T, r *server.BgpServer) *bgp.CapGracefulRestart {
	t.Helper()
	var got *bgp.CapGracefulRestart
	err := r.ListPeer(context.Background(), &api.ListPeerRequest{}, func(p *api.Peer) {
		if p.GetState().GetSessionState() != api.PeerState_SESSION_STATE_ESTABLISHED {
			return
		}
		caps, err := apiutil.UnmarshalCapabilities(p.GetState().GetRemoteCap())
		if err != nil {
			t.Errorf("decoding the speaker's capabilities: %v", err)
			return
		}
		for _, c := range caps {
			if gr, ok := c.(*bgp.CapGracefulRestart); ok {
				got = gr
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// waitUntil polls cond until it holds; the test fails with what after
// 20 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitForNoSession waits until the router has no established session.
func waitForNoSession(t *testing.T, r *server.BgpServer) {
	t.Helper()
	waitUntil(t, "the router still has the predecessor's session", func() bool {
		established := false
		err := r.ListPeer(context.Background(), &api.ListPeerRequest{}, func(p *api.Peer) {
			established = established || p.GetState().GetSessionState() == api.PeerState_SESSION_STATE_ESTABLISHED
		})
		if err != nil {
			t.Fatal(err)
		}
		return !established
	})
}

// waitForRestartCapability waits for an established session and returns
// its graceful restart capability.
func waitForRestartCapability(t *testing.T, r *server.BgpServer) *bgp.CapGracefulRestart {
	t.Helper()
	var c *bgp.CapGracefulRestart
	waitUntil(t, "no established session with a graceful restart capability", func() bool {
		c = restartCapability(t, r)
		return c != nil
	})
	return c
}

// restartBits are the OPEN's Restart State bit and, per family, the
// Forwarding State bit.
func restartBits(c *bgp.CapGracefulRestart) (restarted bool, forwarding map[bgp.Family]bool) {
	forwarding = map[bgp.Family]bool{}
	for _, tuple := range c.Tuples {
		forwarding[bgp.NewFamily(tuple.AFI, tuple.SAFI)] = tuple.Flags&0x80 != 0
	}
	return c.Flags&0x08 != 0, forwarding
}

// A successor's speaker opens its sessions as a restarting speaker's (RFC
// 4724): its OPEN says it restarted with the forwarding state kept, so a
// router keeps the predecessor's routes until the successor's End-of-RIB
// instead of removing them at the OPEN. Without it FRR removed them and
// added them back at the first UPDATE, and for that moment its ECMP sent
// the host's connections to the other LB hosts, which reset them (the
// kernel suite's rolling upgrades lost long-lived connections). A first
// speaker, and a session opened after the restart time, say nothing of a
// restart.
func TestASuccessorSpeakerRestartsThePredecessorsSessions(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the test router listens on port 179 (make test runs as root)")
	}
	router := startGracefulRouter(t)
	log := slog.New(slog.DiscardHandler)
	vip := netip.MustParseAddr("10.96.240.1")
	peer := Peer{Address: netip.MustParseAddr(routerAddr), ASN: 64500, HoldTime: 3 * time.Second}
	want := map[netip.Prefix]netip.Addr{netip.MustParsePrefix("10.96.240.1/32"): netip.MustParseAddr("10.0.0.1")}
	// Sessions opened within the restart time of the successor's first
	// restart; short, so that the test sees one opened after it.
	const restartTime = 3 * time.Second
	start := func(restarting bool, vips ...netip.Addr) *Speaker {
		t.Helper()
		sp, err := Start(context.Background(), log, Config{ASN: 64512, RouterID: netip.MustParseAddr("10.0.0.1"),
			Peers: []Peer{peer}, GracefulRestartTime: restartTime, Restarting: restarting})
		if err != nil {
			t.Fatal(err)
		}
		if err := sp.Sync(Routes(vips...)); err != nil {
			t.Fatal(err)
		}
		return sp
	}

	first := start(false, vip)
	waitForRoutes(t, router, bgp.RF_IPv4_UC, want)
	if restarted, _ := restartBits(waitForRestartCapability(t, router)); restarted {
		t.Error("a first speaker's OPEN says it restarted")
	}
	first.StopForSuccessor()
	waitForNoSession(t, router)

	// The successor serves one more address: the router learns it only
	// from the successor's routes.
	successor := start(true, vip, netip.MustParseAddr("10.96.240.2"))
	defer successor.Stop()
	restarted, forwarding := restartBits(waitForRestartCapability(t, router))
	if !restarted || !forwarding[bgp.RF_IPv4_UC] {
		t.Errorf("the successor's OPEN: restarted %v, forwarding state kept %v; want both set (IPv4 unicast)", restarted, forwarding)
	}
	// It announces once the router's End-of-RIB came, before the deferral
	// time (the restart time) runs out.
	began := time.Now()
	want[netip.MustParsePrefix("10.96.240.2/32")] = netip.MustParseAddr("10.0.0.1")
	waitForRoutes(t, router, bgp.RF_IPv4_UC, want)
	waited := time.Since(began)
	t.Logf("the successor announced %s after its session came up", waited.Round(time.Millisecond))
	if waited > restartTime/2 {
		t.Errorf("the successor announced after %s: it waited for the deferral time, not for the router's End-of-RIB", waited)
	}

	// A session opened once the routers can hold nothing of the
	// predecessor's (the peer's settings changed) is an ordinary one.
	time.Sleep(restartTime)
	peer.HoldTime = 6 * time.Second
	if err := successor.SetPeers(context.Background(), []Peer{peer}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a session opened after the restart time still says the speaker restarted", func() bool {
		c := restartCapability(t, router)
		if c == nil {
			return false
		}
		restarted, _ := restartBits(c)
		return !restarted
	})
	waitForRoutes(t, router, bgp.RF_IPv4_UC, want)
}
