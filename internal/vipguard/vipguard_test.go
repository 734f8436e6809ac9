package vipguard

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

var (
	pfx  = netip.MustParsePrefix
	addr = netip.MustParseAddr

	vip4 = addr("10.99.0.1")
	vip6 = addr("fd00:99::1")
	// hostIP is the LB host's own address on the client's link.
	hostIP = addr("10.1.0.2")
)

// testNet: a client linked to an LB host that serves vip4 and vip6 (local
// addresses on its loopback, as vipaddr's routes make them), runs a
// frontend on port 80 (TCP) and 53 (UDP) of both, and has host services
// listening on every address: TCP 2222 and UDP 2223.
type testNet struct {
	client, lb *network.Host
}

func newTestNet(t *testing.T) *testNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root: network namespaces and nftables (make test runs as root)")
	}
	n := &testNet{}
	for _, h := range []struct {
		name string
		to   **network.Host
	}{{"vg-client", &n.client}, {"vg-lb", &n.lb}} {
		host, err := network.NewHost(h.name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(host.Close)
		*h.to = host
	}
	for _, err := range []error{
		network.LinkHosts(n.client, "eth-lb", []netip.Prefix{pfx("10.1.0.1/24"), pfx("fd00:1::1/64")}, n.lb, "eth-c", []netip.Prefix{pfx("10.1.0.2/24"), pfx("fd00:1::2/64")}),
		n.lb.AddAddress("lo", netip.PrefixFrom(vip4, 32)),
		n.lb.AddAddress("lo", netip.PrefixFrom(vip6, 128)),
		n.client.AddRoute(netip.PrefixFrom(vip4, 32), hostIP),
		n.client.AddRoute(netip.PrefixFrom(vip6, 128), addr("fd00:1::2")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range []string{"0.0.0.0:2222", "[::]:2222", "10.99.0.1:80", "[fd00:99::1]:80"} {
		n.serveTCP(t, a)
	}
	for _, a := range []string{"0.0.0.0:2223", "[::]:2223", "10.99.0.1:53", "[fd00:99::1]:53"} {
		n.serveUDP(t, a)
	}
	return n
}

func (n *testNet) serveTCP(t *testing.T, address string) {
	t.Helper()
	network := "tcp4"
	if strings.HasPrefix(address, "[") {
		network = "tcp6"
	}
	ln, err := n.lb.Listen(network, address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
}

func (n *testNet) serveUDP(t *testing.T, address string) {
	t.Helper()
	network := "udp4"
	if strings.HasPrefix(address, "[") {
		network = "udp6"
	}
	pc, err := n.lb.ListenPacket(network, address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			m, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:m], from)
		}
	}()
}

// reaches reports whether an echo through network to address comes back
// from host h within a short time (a dropped packet is only a timeout).
func reaches(h *network.Host, network, address string) bool {
	if network == "udp" {
		return reachesUDP(h, address)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	c, err := h.DialContext(ctx, network, address)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(700 * time.Millisecond))
	if _, err := io.WriteString(c, "ping"); err != nil {
		return false
	}
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	return err == nil
}

// reachesUDP: a UDP echo comes back from any address. A service bound to
// the wildcard address answers from the host's own address, not from the
// one it was sent to, yet it did receive the datagram.
func reachesUDP(h *network.Host, address string) bool {
	return reachesUDPWith(h, address, []byte("ping"))
}

// reachesUDPWith sends msg: one larger than the link's MTU goes in
// fragments.
func reachesUDPWith(h *network.Host, address string, msg []byte) bool {
	to, err := net.ResolveUDPAddr("udp", address)
	if err != nil {
		return false
	}
	pc, err := h.ListenPacket("udp", ":0")
	if err != nil {
		return false
	}
	defer pc.Close()
	_ = pc.SetDeadline(time.Now().Add(700 * time.Millisecond))
	if _, err := pc.WriteTo(msg, to); err != nil {
		return false
	}
	buf := make([]byte, 4)
	_, _, err = pc.ReadFrom(buf)
	return err == nil
}

// state guards both addresses and lets their frontends through.
func state() State {
	var ports []Port
	for _, a := range []netip.Addr{vip4, vip6} {
		ports = append(ports, Port{Addr: a, Protocol: unix.IPPROTO_TCP, Port: 80}, Port{Addr: a, Protocol: unix.IPPROTO_UDP, Port: 53})
	}
	return State{Addresses: []netip.Addr{vip4, vip6}, Ports: ports}
}

// checks are what reaches what, guarded (without the guard, everything
// does: the host's own services answer on the load balancer's addresses).
var checks = []struct {
	name         string
	fromLB       bool // from the LB host itself (over the loopback)
	network, to  string
	whileGuarded bool
}{
	{"a TCP frontend", false, "tcp", "10.99.0.1:80", true},
	{"a UDP frontend", false, "udp", "10.99.0.1:53", true},
	{"an IPv6 TCP frontend", false, "tcp", "[fd00:99::1]:80", true},
	{"an IPv6 UDP frontend", false, "udp", "[fd00:99::1]:53", true},
	{"the host's TCP service on the address", false, "tcp", "10.99.0.1:2222", false},
	{"the host's UDP service on the address", false, "udp", "10.99.0.1:2223", false},
	{"the host's TCP service on the IPv6 address", false, "tcp", "[fd00:99::1]:2222", false},
	{"the host's UDP service on the IPv6 address", false, "udp", "[fd00:99::1]:2223", false},
	{"the host's TCP service on the host's own address", false, "tcp", "10.1.0.2:2222", true},
	{"the host's UDP service on the host's own address", false, "udp", "10.1.0.2:2223", true},
	{"the host's TCP service on the address, from the host itself", true, "tcp", "10.99.0.1:2222", true},
	{"the host's UDP service on the IPv6 address, from the host itself", true, "udp", "[fd00:99::1]:2223", true},
}

func (n *testNet) expect(t *testing.T, guarded bool) {
	t.Helper()
	for _, c := range checks {
		from := n.client
		if c.fromLB {
			from = n.lb
		}
		want := !guarded || c.whileGuarded
		if got := reaches(from, c.network, c.to); got != want {
			t.Errorf("%s (%s %s), guarded=%v: reached=%v, want %v", c.name, c.network, c.to, guarded, got, want)
		}
	}
}

// Only the frontends reach a guarded address from the network; the host's
// own services stay on its own addresses, and the host itself still
// reaches them on every address.
func TestOnlyFrontendsReachAGuardedAddress(t *testing.T) {
	n := newTestNet(t)
	n.expect(t, false)

	g := New("", n.lb.NetNS())
	if err := g.Sync(state()); err != nil {
		t.Fatal(err)
	}
	n.expect(t, true)
	// A datagram in fragments reaches a frontend: its later fragments
	// have no ports to check.
	if !reachesUDPWith(n.client, "10.99.0.1:53", make([]byte, 4000)) {
		t.Error("a fragmented datagram to a UDP frontend did not reach it")
	}
	if !reachesUDPWith(n.client, "[fd00:99::1]:53", make([]byte, 4000)) {
		t.Error("a fragmented IPv6 datagram to a UDP frontend did not reach it")
	}
	dropped, err := g.Dropped()
	if err != nil {
		t.Fatal(err)
	}
	if dropped == 0 {
		t.Error("Dropped() = 0 after packets to the host's services on guarded addresses")
	}
	// An operator can read the table with the nft tool.
	if out := nft(t, n.lb, "list", "table", "inet", DefaultTable); !strings.Contains(out, "@ports4") || !strings.Contains(out, "10.99.0.1 . tcp . 80") {
		t.Errorf("nft list table:\n%s\nwant the lookup in @ports4 and the frontend 10.99.0.1 . tcp . 80", out)
	}

	// A frontend that goes away closes; an address no longer guarded opens.
	s := state()
	s.Ports = s.Ports[1:] // 10.99.0.1 TCP 80
	if err := g.Sync(s); err != nil {
		t.Fatal(err)
	}
	if reaches(n.client, "tcp", "10.99.0.1:80") {
		t.Error("a removed frontend's port still reaches the guarded address")
	}
	if err := g.Sync(State{Addresses: []netip.Addr{vip6}, Ports: s.Ports}); err != nil {
		t.Fatal(err)
	}
	if !reaches(n.client, "tcp", "10.99.0.1:2222") {
		t.Error("an address no longer guarded is still guarded")
	}
	// Nothing to guard: no table; then guarded again.
	if err := g.Sync(State{}); err != nil {
		t.Fatal(err)
	}
	if err := n.lb.Do(func() error { return exec.Command("nft", "list", "table", "inet", DefaultTable).Run() }); err == nil {
		t.Error("the table is there with nothing to guard")
	}
	if err := g.Sync(state()); err != nil {
		t.Fatal(err)
	}
	n.expect(t, true)

	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	n.expect(t, false)
}

// A firewall reload that flushes the ruleset, or a set emptied by hand,
// is repaired; an intact table is left alone.
func TestRepairRestoresAFlushedGuard(t *testing.T) {
	n := newTestNet(t)
	g := New("", n.lb.NetNS())
	if err := g.Sync(state()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		nft  []string
	}{
		{"nft flush ruleset", []string{"flush", "ruleset"}},
		{"a set flushed", []string{"flush", "set", "inet", DefaultTable, "ports4"}},
		{"a rule deleted", []string{"flush", "chain", "inet", DefaultTable, "prerouting"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if repaired, err := g.Repair(); err != nil || repaired {
				t.Fatalf("Repair() of an intact table = %v, %v; want false, nil", repaired, err)
			}
			nft(t, n.lb, tc.nft...)
			if repaired, err := g.Repair(); err != nil || !repaired {
				t.Fatalf("Repair() after %s = %v, %v; want true, nil", tc.name, repaired, err)
			}
			n.expect(t, true)
		})
	}
}

func nft(t *testing.T, h *network.Host, args ...string) string {
	t.Helper()
	var out []byte
	err := h.Do(func() (err error) {
		out, err = exec.Command("nft", args...).CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestNormaliseKeepsOnlyThePortsOfGuardedAddresses(t *testing.T) {
	in := State{
		Addresses: []netip.Addr{vip6, vip4, vip4},
		Ports: []Port{
			{Addr: addr("192.0.2.1"), Protocol: unix.IPPROTO_TCP, Port: 80},
			{Addr: vip4, Protocol: unix.IPPROTO_UDP, Port: 53},
			{Addr: netip.AddrFrom16(vip4.As16()), Protocol: unix.IPPROTO_TCP, Port: 80},
			{Addr: vip4, Protocol: unix.IPPROTO_UDP, Port: 53},
		},
	}
	got := normalise(in)
	want := State{
		Addresses: []netip.Addr{vip4, vip6},
		Ports:     []Port{{Addr: vip4, Protocol: unix.IPPROTO_TCP, Port: 80}, {Addr: vip4, Protocol: unix.IPPROTO_UDP, Port: 53}},
	}
	if !equal(got, want) {
		t.Errorf("normalise(%v) = %v, want %v", in, got, want)
	}
}

// A connection established to a frontend goes on after the frontend is
// removed (its port leaves the set) while it drains: its socket is bound
// to the address itself. Before, the guard dropped it mid-drain.
func TestAConnectionOfARemovedFrontendDrains(t *testing.T) {
	n := newTestNet(t)
	g := New("", n.lb.NetNS())
	t.Cleanup(func() { _ = g.Remove() })
	if err := g.Sync(state()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := n.client.DialContext(ctx, "tcp", "10.99.0.1:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo := func(msg string) error {
		_ = c.SetDeadline(time.Now().Add(time.Second))
		if _, err := io.WriteString(c, msg); err != nil {
			return err
		}
		_, err := io.ReadFull(c, make([]byte, len(msg)))
		return err
	}
	if err := echo("before"); err != nil {
		t.Fatal(err)
	}
	s := state()
	s.Ports = s.Ports[1:] // 10.99.0.1 TCP 80 removed
	for _, tracked := range []bool{false, true} {
		s.Tracked = tracked
		if err := g.Sync(s); err != nil {
			t.Fatal(err)
		}
		if err := echo("draining"); err != nil {
			t.Fatalf("the established connection of the removed frontend (tracked=%v): %v", tracked, err)
		}
		if repaired, err := g.Repair(); err != nil || repaired {
			t.Errorf("Repair() right after Sync(tracked=%v) = %v, %v; want false, nil", tracked, repaired, err)
		}
		// The host's own services stay off the address.
		if reaches(n.client, "tcp", "10.99.0.1:2222") || reaches(n.client, "udp", "10.99.0.1:2223") {
			t.Errorf("the host's own service reached on the guarded address (tracked=%v)", tracked)
		}
	}
}
