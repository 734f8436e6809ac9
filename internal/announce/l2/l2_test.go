package l2

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/mdlayher/arp"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

var (
	vip4 = netip.MustParseAddr("10.5.1.1")
	vip6 = netip.MustParseAddr("fd00:5:1::1")
)

// segment: a client and two LB hosts on one switch (a bridge in a host of
// its own). Each LB host has both addresses local (on lo) and serves its
// name on port 80 of each; the client routes the addresses' subnets on
// link, so it finds them by ARP and NDP, as a router does.
type segment struct {
	sw, client *network.Host
	lbs        map[string]*network.Host
	macs       map[string]net.HardwareAddr
}

func newSegment(t *testing.T) *segment {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root: network namespaces, packet sockets and nftables (make test runs as root)")
	}
	s := &segment{lbs: map[string]*network.Host{}, macs: map[string]net.HardwareAddr{}}
	host := func(name string) *network.Host {
		h, err := network.NewHost(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Close)
		// A tentative link-local address holds neighbour discovery.
		if err := h.SetSysctl("net/ipv6/conf/default/accept_dad", "0"); err != nil {
			t.Fatal(err)
		}
		return h
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	pfx := netip.MustParsePrefix
	s.sw = host("l2-switch")
	must(s.sw.AddBridge("br0"))
	plug := func(h *network.Host, port, dev string, addrs ...netip.Prefix) {
		must(network.LinkHosts(s.sw, port, nil, h, dev, addrs))
		must(s.sw.AttachToBridge(port, "br0"))
	}
	s.client = host("l2-client")
	plug(s.client, "p-client", "eth0", pfx("10.5.0.100/24"), pfx("fd00:5::100/64"))
	must(s.client.AddLinkRoute(pfx("10.5.1.0/24"), "eth0"))
	must(s.client.AddLinkRoute(pfx("fd00:5:1::/64"), "eth0"))
	for i, name := range []string{"lb-a", "lb-b"} {
		h := host("l2-" + name)
		plug(h, "p-"+name, devOf(name), pfx(fmt.Sprintf("10.5.0.%d/24", i+1)), pfx(fmt.Sprintf("fd00:5::%d/64", i+1)))
		must(h.AddAddress("lo", netip.PrefixFrom(vip4, 32)))
		must(h.AddAddress("lo", netip.PrefixFrom(vip6, 128)))
		mac, err := h.HardwareAddr(devOf(name))
		must(err)
		s.lbs[name], s.macs[name] = h, mac
		for _, vip := range []netip.Addr{vip4, vip6} {
			ln, err := h.Listen("tcp", netip.AddrPortFrom(vip, 80).String())
			must(err)
			t.Cleanup(func() { ln.Close() })
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					io.WriteString(c, name)
					c.Close()
				}
			}()
		}
	}
	return s
}

// devOf names the LB host's interface on the segment: one name per host,
// because the net package caches interface names and indexes for the
// process, not per network namespace, and IPv6 link-local addresses are
// bound by name (%eth0).
func devOf(lb string) string { return "eth-" + strings.TrimPrefix(lb, "lb-") }

// start runs an announcer on the LB host name, offering both addresses.
func (s *segment) start(t *testing.T, name string) *Announcer {
	t.Helper()
	h := s.lbs[name]
	var a *Announcer
	err := h.Do(func() (err error) {
		a, err = Start(context.Background(), testr.New(t).WithName(name), Config{Group: "test", Node: name,
			Interfaces: []string{devOf(name)}, Interval: 50 * time.Millisecond, KernelTable: "ebb-l2-test", NetNS: h.NetNS()})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Stop() })
	a.SetKeys(testKeys(t))
	if err := a.SetLocal([]netip.Addr{vip4, vip6}); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync([]netip.Addr{vip4, vip6}); err != nil {
		t.Fatal(err)
	}
	return a
}

// ask connects from the client to vip and returns the name of the LB host
// that answered.
func (s *segment) ask(vip netip.Addr) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	c, err := s.client.DialContext(ctx, "tcp", netip.AddrPortFrom(vip, 80).String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	b, err := io.ReadAll(c)
	return string(b), err
}

// waitServedBy waits until the client's connections to vip reach want.
func (s *segment) waitServedBy(t *testing.T, vip netip.Addr, want string) time.Duration {
	t.Helper()
	start := time.Now()
	var last string
	for time.Since(start) < 10*time.Second {
		got, err := s.ask(vip)
		if err == nil && got == want {
			return time.Since(start)
		}
		last = fmt.Sprint(got, err)
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("connections to %s never reached %s (last: %s)", vip, want, last)
	return 0
}

// owner returns the announcer that owns vip, failing unless exactly one
// does.
func owner(t *testing.T, vip netip.Addr, as map[string]*Announcer) string {
	t.Helper()
	var owners []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		owners = owners[:0]
		for name, a := range as {
			if slices.Contains(a.Owned(), vip) {
				owners = append(owners, name)
			}
		}
		if len(owners) == 1 {
			return owners[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s owned by %v, want exactly one", vip, owners)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// clientARP opens an ARP client on the client's segment interface.
func (s *segment) clientARP(t *testing.T) *arp.Client {
	t.Helper()
	var c *arp.Client
	if err := s.client.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		c, err = arp.Dial(ifi)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

// arpReplies sends one ARP request for vip from the client and returns
// every MAC that answered within 300 ms.
func (s *segment) arpReplies(t *testing.T) []string {
	t.Helper()
	c := s.clientARP(t)
	defer c.Close()
	if err := c.Request(vip4); err != nil {
		t.Fatal(err)
	}
	var macs []string
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	for {
		p, _, err := c.Read()
		if err != nil {
			break
		}
		if p.Operation == arp.OperationReply && p.SenderIP == vip4 && !slices.Contains(macs, p.SenderHardwareAddr.String()) {
			macs = append(macs, p.SenderHardwareAddr.String())
		}
	}
	return macs
}

// Two replicas on one segment: each address has one owner, which alone
// answers ARP and NDP for it, so the client reaches the address on the
// owner; an owner that withdraws, or whose host vanishes, hands its
// addresses to the other, which announces them at once (the client's
// neighbour entry changes without it asking again).
func TestOneOwnerAnswersAndTheOtherTakesOver(t *testing.T) {
	s := newSegment(t)
	as := map[string]*Announcer{"lb-a": s.start(t, "lb-a"), "lb-b": s.start(t, "lb-b")}
	other := func(name string) string {
		if name == "lb-a" {
			return "lb-b"
		}
		return "lb-a"
	}
	for _, vip := range []netip.Addr{vip4, vip6} {
		o := owner(t, vip, as)
		s.waitServedBy(t, vip, o)
		mac, _, err := s.client.Neighbour(vip)
		if err != nil || mac.String() != s.macs[o].String() {
			t.Fatalf("the client's neighbour entry for %s is %v (%v), want %s's %s", vip, mac, err, o, s.macs[o])
		}
		t.Logf("%s owned by %s", vip, o)
	}

	// Only the owner answers ARP: the kernel of the other host, which has
	// the address local too, stays silent.
	o4 := owner(t, vip4, as)
	onlyOwnerAnswers := func(o string) {
		t.Helper()
		if macs := s.arpReplies(t); !slices.Equal(macs, []string{s.macs[o].String()}) {
			t.Fatalf("ARP replies for %s from %v, want only the owner %s (%s)", vip4, macs, o, s.macs[o])
		}
	}
	onlyOwnerAnswers(o4)
	// The other host sending from the address does not claim it: its ARP
	// request for the client carries its own address (without the rule,
	// the client would point the address at it).
	if err := s.lbs[other(o4)].Do(func() error {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: vip4.AsSlice()}, &net.UDPAddr{IP: net.IPv4(10, 5, 0, 100), Port: 9000})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("hello"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the ARP exchange; nothing to wait on from here
	if mac, _, _ := s.client.Neighbour(vip4); mac.String() != s.macs[o4].String() {
		t.Fatalf("after %s sent from %s, the client's entry is %v, want the owner's %s", other(o4), vip4, mac, s.macs[o4])
	}
	if mac, _, _ := s.client.Neighbour(netip.MustParseAddr(map[string]string{"lb-a": "10.5.0.1", "lb-b": "10.5.0.2"}[other(o4)])); mac.String() != s.macs[other(o4)].String() {
		t.Fatalf("the client did not learn %s's own address from its ARP request (entry %v)", other(o4), mac)
	}

	// The owner withdraws (its host is leaving): the other takes over.
	for _, vip := range []netip.Addr{vip4, vip6} {
		o := owner(t, vip, as)
		as[o].Sync(nil)
		took := s.waitServedBy(t, vip, other(o))
		t.Logf("withdrawn: %s served by %s after %s", vip, other(o), took)
		if mac, _, _ := s.client.Neighbour(vip); mac.String() != s.macs[other(o)].String() {
			t.Fatalf("after the takeover the client's entry for %s is %v, want %s", vip, mac, s.macs[other(o)])
		}
		if vip.Is4() {
			// The withdrawn host still has the address local (it serves
			// its established connections): its kernel stays silent too.
			onlyOwnerAnswers(other(o))
		}
		as[o].Sync([]netip.Addr{vip4, vip6})
	}

	// The owner's host vanishes (its switch port goes down): the other
	// takes over once it misses the heartbeats.
	for _, vip := range []netip.Addr{vip4, vip6} {
		o := owner(t, vip, as)
		s.waitServedBy(t, vip, o)
		if err := s.sw.SetLinkUp("p-"+o, false); err != nil {
			t.Fatal(err)
		}
		took := s.waitServedBy(t, vip, other(o))
		t.Logf("%s's host cut off: %s served by %s after %s", o, vip, other(o), took)
		mac, _, _ := s.client.Neighbour(vip)
		if mac.String() != s.macs[other(o)].String() {
			t.Fatalf("the client's entry for %s is %v, want %s's %s", vip, mac, other(o), s.macs[other(o)])
		}
		if err := s.sw.SetLinkUp("p-"+o, true); err != nil {
			t.Fatal(err)
		}
	}
}

// An address restricted to other interfaces is owned as before but not
// answered for on this one; allowed again, it is.
func TestRestrictKeepsAnAddressOffAnInterface(t *testing.T) {
	s := newSegment(t)
	as := map[string]*Announcer{"lb-a": s.start(t, "lb-a"), "lb-b": s.start(t, "lb-b")}
	o := owner(t, vip4, as)
	if macs := s.arpReplies(t); !slices.Equal(macs, []string{s.macs[o].String()}) {
		t.Fatalf("before the restriction, ARP replies from %v, want the owner %s's", macs, o)
	}
	as[o].Restrict(map[netip.Addr][]string{vip4: {"eth-elsewhere"}})
	if macs := s.arpReplies(t); len(macs) != 0 {
		t.Fatalf("restricted to another interface, %s is answered by %v", vip4, macs)
	}
	if !slices.Contains(as[o].Owned(), vip4) {
		t.Fatalf("the restriction changed the election: %s owns %v", o, as[o].Owned())
	}
	as[o].Restrict(map[netip.Addr][]string{vip4: {devOf(o)}})
	if macs := s.arpReplies(t); !slices.Equal(macs, []string{s.macs[o].String()}) {
		t.Fatalf("allowed on %s again, ARP replies from %v", devOf(o), macs)
	}
}

// An owner whose interfaces are taken away leaves the segment (the other
// replica stops hearing it and takes its addresses over); given its
// interface again, it is heard, wins its addresses back and announces
// them, so the client's entry follows.
func TestSetInterfacesLeavesAndRejoinsTheSegment(t *testing.T) {
	s := newSegment(t)
	as := map[string]*Announcer{"lb-a": s.start(t, "lb-a"), "lb-b": s.start(t, "lb-b")}
	o := owner(t, vip4, as)
	other := map[string]string{"lb-a": "lb-b", "lb-b": "lb-a"}[o]
	s.waitServedBy(t, vip4, o)
	if err := as[o].SetInterfaces(nil); err != nil {
		t.Fatal(err)
	}
	if got := as[o].Interfaces(); len(got) != 0 {
		t.Fatalf("interfaces %v after taking them all away", got)
	}
	took := s.waitServedBy(t, vip4, other)
	t.Logf("%s without interfaces: %s served by %s after %s", o, vip4, other, took)
	// Sockets open in the calling thread's network namespace: the host's.
	err := s.lbs[o].Do(func() error { return as[o].SetInterfaces([]string{devOf(o), "eth-missing"}) })
	if err == nil || !strings.Contains(err.Error(), "eth-missing") || strings.Contains(err.Error(), devOf(o)) {
		t.Fatalf("%s and a missing interface: %v, want an error about the missing one only", devOf(o), err)
	}
	if got := as[o].Interfaces(); !slices.Equal(got, []string{devOf(o)}) {
		t.Fatalf("interfaces %v, want [%s]", got, devOf(o))
	}
	back := s.waitServedBy(t, vip4, o)
	t.Logf("%s on %s again: %s served by it after %s", o, devOf(o), vip4, back)
	if mac, _, _ := s.client.Neighbour(vip4); mac.String() != s.macs[o].String() {
		t.Fatalf("the client's entry for %s is %v, want %s's %s", vip4, mac, o, s.macs[o])
	}
}

// A takeover is announced in a burst and again about 1 s and 2 s later,
// so a neighbour that missed the burst is set right within seconds.
func TestTakeoverIsAnnouncedAgainLater(t *testing.T) {
	s := newSegment(t)
	as := map[string]*Announcer{"lb-a": s.start(t, "lb-a"), "lb-b": s.start(t, "lb-b")}
	o := owner(t, vip4, as)
	other := map[string]string{"lb-a": "lb-b", "lb-b": "lb-a"}[o]
	c := s.clientARP(t)
	defer c.Close()
	took := time.Now()
	as[o].Sync(nil) // withdraws: the other takes vip4 over at once
	var at []time.Duration
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	for {
		p, _, err := c.Read()
		if err != nil {
			break
		}
		if p.SenderIP == vip4 && p.TargetIP == vip4 && p.SenderHardwareAddr.String() == s.macs[other].String() {
			at = append(at, time.Since(took).Round(10*time.Millisecond))
		}
	}
	t.Logf("gratuitous ARP from %s for %s at %v", other, vip4, at)
	late := 0
	for _, d := range at {
		if d > 900*time.Millisecond {
			late++
		}
	}
	if len(at) < 3 || late < 2 {
		t.Fatalf("gratuitous ARP at %v after the takeover: want a burst and two more after about 1 s and 2 s", at)
	}
}

// A neighbour that routes (IP forwarding on, as the router in front of
// the LB hosts) takes the new owner's MAC within the dead-after time and
// a heartbeat when the owner's host vanishes, although it confirmed its
// entry for the address just before.
func TestTakeoverReachesARouterAtOnce(t *testing.T) {
	s := newSegment(t)
	if err := s.client.SetSysctl("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	as := map[string]*Announcer{"lb-a": s.start(t, "lb-a"), "lb-b": s.start(t, "lb-b")}
	o := owner(t, vip4, as)
	other := map[string]string{"lb-a": "lb-b", "lb-b": "lb-a"}[o]
	for range 3 {
		s.waitServedBy(t, vip4, o) // refreshes the entry: it was just confirmed
	}
	// The owner's host vanishes: the other takes over after dead-after.
	if err := s.sw.SetLinkUp("p-"+o, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.sw.SetLinkUp("p-"+o, true) })
	took := time.Now()
	deadline := time.Now().Add(time.Second)
	for {
		mac, _, _ := s.client.Neighbour(vip4)
		if mac.String() == s.macs[other].String() {
			t.Logf("the router's entry for %s moved to %s %s after %s vanished", vip4, other, time.Since(took).Round(time.Millisecond), o)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router's entry for %s is still %v %s after %s vanished, want %s's %s", vip4, mac, time.Since(took).Round(time.Millisecond), o, other, s.macs[other])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An interface without a usable link-local address when the announcer
// starts (IPv6 off on it here; right after a link comes up, its link-local
// address is missing or tentative for a moment) gets its NDP responder
// once it has one: the IPv6 address is then answered for there. It was
// left without NDP for good before (a unit-test run in CI: "No NDP on this
// interface", and the IPv6 address never moved to that host).
func TestNDPStartsOnceTheInterfaceHasALinkLocalAddress(t *testing.T) {
	s := newSegment(t)
	h, dev := s.lbs["lb-a"], devOf("lb-a")
	if err := h.SetSysctl("net/ipv6/conf/"+dev+"/disable_ipv6", "1"); err != nil {
		t.Fatal(err)
	}
	a := s.start(t, "lb-a")
	time.Sleep(300 * time.Millisecond)
	if a.ifaces[0].ndp.Load() != nil {
		t.Fatal("an NDP responder on an interface without IPv6")
	}
	if got, err := s.ask(vip6); err == nil {
		t.Fatalf("the client reached %s (%s) with no NDP responder", vip6, got)
	}
	// IPv6 back on the interface (its global address too: disabling IPv6
	// removed it).
	if err := h.SetSysctl("net/ipv6/conf/"+dev+"/disable_ipv6", "0"); err != nil {
		t.Fatal(err)
	}
	if err := h.AddAddress(dev, netip.MustParsePrefix("fd00:5::1/64")); err != nil {
		t.Fatal(err)
	}
	took := s.waitServedBy(t, vip6, "lb-a")
	t.Logf("%s answered for by lb-a %s after IPv6 came back on %s", vip6, took.Round(time.Millisecond), dev)
}

// A firewall reload on a host that does not own the address (`nft flush
// ruleset`) removes the rules that keep its kernel from answering ARP for
// it: both hosts answer, and neighbours may point the address at the wrong
// one. Repair writes them again, and the owner alone answers; an intact
// table is left alone.
func TestRepairRestoresTheKernelsSilence(t *testing.T) {
	s := newSegment(t)
	as := map[string]*Announcer{"lb-a": s.start(t, "lb-a"), "lb-b": s.start(t, "lb-b")}
	o := owner(t, vip4, as)
	s.waitServedBy(t, vip4, o)
	other := map[string]string{"lb-a": "lb-b", "lb-b": "lb-a"}[o]
	if repaired, err := as[other].Repair(); err != nil || repaired {
		t.Fatalf("Repair() of intact rules = %v, %v; want false, nil", repaired, err)
	}
	if err := s.lbs[other].Do(func() error { return exec.Command("nft", "flush", "ruleset").Run() }); err != nil {
		t.Fatal(err)
	}
	if macs := s.arpReplies(t); len(macs) != 2 {
		t.Fatalf("ARP replies for %s from %v after the flush, want both hosts' (the test shows nothing otherwise)", vip4, macs)
	}
	if repaired, err := as[other].Repair(); err != nil || !repaired {
		t.Fatalf("Repair() after the flush = %v, %v; want true, nil", repaired, err)
	}
	if macs := s.arpReplies(t); !slices.Equal(macs, []string{s.macs[o].String()}) {
		t.Fatalf("ARP replies for %s from %v after the repair, want only the owner %s (%s)", vip4, macs, o, s.macs[o])
	}
}

// A host on the segment with NET_RAW but no key sends heartbeats as a
// replica whose name ranks first for both addresses, unsigned (as version
// 1 was) and signed with a key of its own: it takes nothing, the owner
// keeps answering, and every frame is counted as refused. Before
// heartbeats were signed, one frame took the addresses.
func TestForgedHeartbeatsTakeNothing(t *testing.T) {
	s := newSegment(t)
	as := map[string]*Announcer{"lb-a": s.start(t, "lb-a"), "lb-b": s.start(t, "lb-b")}
	o := owner(t, vip4, as)
	s.waitServedBy(t, vip4, o)
	// A name that wins both addresses against the two replicas.
	offers := map[string][]netip.Addr{"lb-a": {vip4, vip6}, "lb-b": {vip4, vip6}}
	forger := ""
	for i := 0; forger == ""; i++ {
		if n := fmt.Sprintf("forger-%d", i); len(owned(n, []netip.Addr{vip4, vip6}, offers)) == 2 {
			forger = n
		}
	}
	ownKey, err := ParseKeys(map[string][]byte{"k1": []byte("the forger's own key, 32 bytes..")})
	if err != nil {
		t.Fatal(err)
	}
	// Version 1's frame: no key ID, no seq, no MAC.
	v1 := append(append([]byte{}, heartbeatMagic[:]...), 1, byte(len("test")))
	v1 = append(append(v1, "test"...), byte(len(forger)))
	v1 = append(append(v1, forger...), 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 1, 0, 1, 0, 2, 4)
	v1 = append(append(append(v1, vip4.AsSlice()...), 6), vip6.AsSlice()...)
	var ifc *iface
	if err := s.client.Do(func() (err error) { ifc, err = openInterface("eth0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ifc.close()
	forged := &sender{keys: ownKey}
	for range 40 {
		frames := append(forged.frames("test", forger, 9, 1, []netip.Addr{vip4, vip6}, nil), v1)
		for _, f := range frames {
			if err := ifc.broadcast(f); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	for name, a := range as {
		if got := a.members.live(time.Now()); len(got) != 1 {
			t.Errorf("%s counts %d peers, want only the other replica: %v", name, len(got), got)
		}
	}
	if got := owner(t, vip4, as); got != o {
		t.Fatalf("%s moved from %s to %s", vip4, o, got)
	}
	if macs := s.arpReplies(t); !slices.Equal(macs, []string{s.macs[o].String()}) {
		t.Fatalf("ARP replies for %s from %v, want only the owner %s", vip4, macs, o)
	}
	for name, a := range as {
		n := a.refused[refusedUnsigned].Load()
		if n < 80 {
			t.Errorf("%s refused %d unauthenticated frames, want the 80 sent", name, n)
		}
	}
}
