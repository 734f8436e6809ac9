package lb

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ebbdev/ebb/internal/announce/l2"
	"github.com/ebbdev/ebb/internal/lbsync"
	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// A replica's announcements wait for its first Sync, whatever arrives
// before it (AnnouncementPolicies, BGPPeers): until then its L2 announcer
// stays silent, so a predecessor on the host keeps the node's addresses.
// (CI: a successor told its policies before its first sync spoke for the
// node offering nothing, and the other host took its address.)
func TestNothingIsAnnouncedBeforeTheFirstSync(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: network namespaces and packet sockets (make test runs as root)")
	}
	host := func(name string) *network.Host {
		h, err := network.NewHost(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Close)
		return h
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	sw, a, b := host("ord-switch"), host("ord-a"), host("ord-b")
	must(sw.AddBridge("br0"))
	for i, h := range []*network.Host{a, b} {
		port, dev := []string{"p-ord-a", "p-ord-b"}[i], []string{"eo-a", "eo-b"}[i]
		must(network.LinkHosts(sw, port, nil, h, dev, []netip.Prefix{netip.MustParsePrefix([]string{"10.6.0.1/24", "10.6.0.2/24"}[i])}))
		must(sw.AttachToBridge(port, "br0"))
	}
	keys, err := l2.ParseKeys(map[string][]byte{"k1": []byte("0123456789abcdef0123456789abcdef")})
	must(err)
	start := func(h *network.Host, node, dev string) *l2.Announcer {
		var ann *l2.Announcer
		must(h.Do(func() (err error) {
			ann, err = l2.Start(context.Background(), testr.New(t).WithName(node), l2.Config{Group: "test", Node: node,
				Interfaces: []string{dev}, Interval: 50 * time.Millisecond, KernelTable: "ebb-l2-order-test", NetNS: h.NetNS()})
			return err
		}))
		t.Cleanup(func() { ann.Stop() })
		ann.SetKeys(keys)
		return ann
	}
	observer := start(b, "node-b", "eo-b")
	vip := netip.MustParseAddr("10.6.1.1")
	must(observer.Sync([]netip.Addr{vip}))
	sinks := &addressSinks{l2: start(a, "node-a", "eo-a"), flagInterfaces: []string{"eo-a"}}

	// Policies and peers arrive before the first Sync: node-a stays silent.
	sinks.setPlan(logr.Discard(), lbsync.AnnouncementPlan{})
	sinks.setBGPPeers(context.Background(), logr.Discard(), nil, nil)
	time.Sleep(400 * time.Millisecond) // eight heartbeat intervals: nothing to wait on but time
	if n := peers(t, observer); n != 0 {
		t.Fatalf("before node-a's first Sync, the other host hears %v peers, want 0", n)
	}
	// The first Sync speaks for the node.
	must(sinks.Sync([]netip.Addr{vip}))
	deadline := time.Now().Add(5 * time.Second)
	for peers(t, observer) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("after node-a's first Sync, the other host never heard it")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// peers is an announcer's ebb_lb_l2_peers.
func peers(t *testing.T, a *l2.Announcer) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(a.Collector()); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "ebb_lb_l2_peers" {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no ebb_lb_l2_peers")
	return 0
}

// What a replica reports served: with no way of announcing, every address
// it made local; none while withdrawn or before its first Sync; with L2,
// an address only on its owner (the other hosts get no traffic for it).
func TestServedIsWhatReachesTheHost(t *testing.T) {
	vip := netip.MustParseAddr("10.6.1.1")
	plain := &addressSinks{}
	if got := plain.served(); len(got) != 0 {
		t.Fatalf("before the first Sync, served %v", got)
	}
	if err := plain.Sync([]netip.Addr{vip}); err != nil {
		t.Fatal(err)
	}
	if got := plain.served(); len(got) != 1 || got[0] != "10.6.1.1" {
		t.Fatalf("no announcer: served %v, want 10.6.1.1", got)
	}
	plain.setWithdrawn(logr.Discard(), true)
	if got := plain.served(); len(got) != 0 {
		t.Fatalf("withdrawn: served %v", got)
	}

	if os.Geteuid() != 0 {
		t.Fatal("needs root: network namespaces and packet sockets (make test runs as root)")
	}
	sw, err := network.NewHost("srv-switch")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sw.Close)
	if err := sw.AddBridge("br0"); err != nil {
		t.Fatal(err)
	}
	keys, err := l2.ParseKeys(map[string][]byte{"k1": []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	var sinks []*addressSinks
	for i, node := range []string{"node-a", "node-b"} {
		h, err := network.NewHost("srv-" + node)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Close)
		port, dev := "p-srv-"+node[5:], "es-"+node[5:]
		if err := network.LinkHosts(sw, port, nil, h, dev, []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 7, 0, byte(i + 1)}), 24)}); err != nil {
			t.Fatal(err)
		}
		if err := sw.AttachToBridge(port, "br0"); err != nil {
			t.Fatal(err)
		}
		var ann *l2.Announcer
		if err := h.Do(func() (err error) {
			ann, err = l2.Start(context.Background(), testr.New(t).WithName(node), l2.Config{Group: "test", Node: node,
				Interfaces: []string{dev}, Interval: 50 * time.Millisecond, KernelTable: "ebb-l2-served-test", NetNS: h.NetNS()})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ann.Stop() })
		ann.SetKeys(keys)
		s := &addressSinks{l2: ann, flagInterfaces: []string{dev}}
		if err := s.Sync([]netip.Addr{vip}); err != nil {
			t.Fatal(err)
		}
		sinks = append(sinks, s)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, b := sinks[0].served(), sinks[1].served()
		owners := len(sinks[0].l2.Owned()) + len(sinks[1].l2.Owned())
		if owners == 1 && len(a)+len(b) == 1 {
			owner := sinks[0]
			if len(b) == 1 {
				owner = sinks[1]
			}
			if len(owner.l2.Owned()) != 1 {
				t.Fatalf("the replica that does not own %s reports it served", vip)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: served %v and %v, owned %v and %v; want exactly the owner to serve %s", a, b, sinks[0].l2.Owned(), sinks[1].l2.Owned(), vip)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
