package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// The behaviour table below runs against both engines on a small
// dual-stack network the test makes: a client host (10.2.0.2, fd00:2::2)
// routed through the load balancer's host (10.2.0.1 and 10.1.0.1, fd00:2::1
// and fd00:1::1; the frontend addresses 10.9.0.1 and fd00:9::1 local to
// it) to a backend host (10.1.0.2, fd00:1::2) that has no route back to
// the client, so that replies come back through the load balancer only if
// it translates the source too.
type addressPlan struct {
	frontend, backend, client, lbToBackend netip.Addr
}

var plans = map[string]addressPlan{
	"IPv4": {frontend: netip.MustParseAddr("10.9.0.1"), backend: netip.MustParseAddr("10.1.0.2"), client: netip.MustParseAddr("10.2.0.2"), lbToBackend: netip.MustParseAddr("10.1.0.1")},
	"IPv6": {frontend: netip.MustParseAddr("fd00:9::1"), backend: netip.MustParseAddr("fd00:1::2"), client: netip.MustParseAddr("fd00:2::2"), lbToBackend: netip.MustParseAddr("fd00:1::1")},
}

// engineNet is the test network and a data plane of one engine on it,
// used through the addresses of one family.
type engineNet struct {
	engine                Engine
	path                  KernelPath
	ip                    addressPlan
	client, lb, backendNS *network.Host
	d                     *DataPlane
	reg                   *prometheus.Registry
}

func newEngineNet(t *testing.T, engine Engine, family string) *engineNet {
	t.Helper()
	return newEngineNetOn(t, engineVariant{engine: engine}, family)
}

// engineVariant is an engine, and for the kernel engine its path.
type engineVariant struct {
	engine Engine
	path   KernelPath
}

func (v engineVariant) String() string {
	if v.path == KernelPathEBPF {
		return string(v.engine) + "-eBPF"
	}
	return string(v.engine)
}

// engineVariants are what the behaviour table runs against: the proxy,
// and the kernel engine on each of its paths.
var engineVariants = []engineVariant{{engine: EngineProxy}, {engine: EngineKernel}, {engine: EngineKernel, path: KernelPathEBPF}}

func newEngineNetOn(t *testing.T, v engineVariant, family string) *engineNet {
	t.Helper()
	n := &engineNet{engine: v.engine, path: v.path, ip: plans[family]}
	for _, h := range []struct {
		name string
		to   **network.Host
	}{{"client", &n.client}, {"lb", &n.lb}, {"backend", &n.backendNS}} {
		host, err := network.NewHost(h.name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(host.Close)
		// No duplicate address detection on the links to come: a
		// tentative link-local address holds neighbour discovery, and so
		// a first UDP datagram, for a second or more.
		if err := host.SetSysctl("net/ipv6/conf/default/accept_dad", "0"); err != nil {
			t.Fatal(err)
		}
		*h.to = host
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	pfx := netip.MustParsePrefix
	must(network.LinkHosts(n.lb, "to-client", []netip.Prefix{pfx("10.2.0.1/24"), pfx("fd00:2::1/64")}, n.client, "eth0", []netip.Prefix{pfx("10.2.0.2/24"), pfx("fd00:2::2/64")}))
	must(network.LinkHosts(n.lb, "to-backend", []netip.Prefix{pfx("10.1.0.1/24"), pfx("fd00:1::1/64")}, n.backendNS, "eth0", []netip.Prefix{pfx("10.1.0.2/24"), pfx("fd00:1::2/64")}))
	must(n.client.AddRoute(pfx("10.9.0.0/24"), netip.MustParseAddr("10.2.0.1")))
	must(n.client.AddRoute(pfx("fd00:9::/64"), netip.MustParseAddr("fd00:2::1")))
	for _, plan := range plans {
		must(n.lb.AddAddress("lo", netip.PrefixFrom(plan.frontend, plan.frontend.BitLen())))
	}
	must(n.lb.SetSysctl("net/ipv4/ip_forward", "1"))
	must(n.lb.SetSysctl("net/ipv6/conf/all/forwarding", "1"))
	// Each host resolves its IPv6 neighbours before the test's first
	// connection, whose deadline is under the second a lost neighbour
	// solicitation costs (network.Host.WaitNeighbor).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, nb := range []struct {
		host *network.Host
		addr string
	}{{n.client, "fd00:2::1"}, {n.lb, "fd00:2::2"}, {n.lb, "fd00:1::2"}, {n.backendNS, "fd00:1::1"}} {
		must(nb.host.WaitNeighbor(ctx, netip.MustParseAddr(nb.addr)))
	}
	n.reg = prometheus.NewRegistry()
	if n.path == KernelPathEBPF {
		// The pins outlive the data plane (they are how its flows
		// survive a restart): removed when the test ends, after its
		// data planes closed.
		t.Cleanup(func() {
			if err := newEBPFPath(n.options()).remove(); err != nil {
				t.Error(err)
			}
		})
	}
	opts := n.options()
	opts.Registerer = n.reg
	n.d = newDataPlane(t, opts)
	return n
}

// options are the data plane's options: the engine and kernel path, in
// the load balancer's host.
func (n *engineNet) options() Options {
	return Options{Engine: n.engine, KernelPath: n.path, NetNS: n.lb.NetNS(), DialContext: n.lb.DialContext}
}

// rejects checks that the data plane refuses fe with a message that
// contains why: for what this engine cannot do.
func (n *engineNet) rejects(t *testing.T, fe Frontend, why string) {
	t.Helper()
	var res ApplyResult
	err := n.lb.Do(func() (err error) {
		res, err = n.d.Apply(Config{Frontends: []Frontend{fe}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err == nil || !strings.Contains(err.Error(), why) {
		t.Errorf("%s applied: %v; want it refused, saying %q", n.engineName(), err, why)
	}
}

func (n *engineNet) engineName() string { return engineVariant{n.engine, n.path}.String() }

// apply applies frontends inside the load balancer's host, where the
// proxy engine's sockets must open.
func (n *engineNet) apply(t *testing.T, fs ...Frontend) {
	t.Helper()
	if err := n.lb.Do(func() error { return applyAll(n.d, Config{Frontends: fs}) }); err != nil {
		t.Fatal(err)
	}
}

// echo starts a TCP echo server on the backend host and returns it as a
// Backend.
func (n *engineNet) echo(t *testing.T, port uint16) (Backend, *testBackend) {
	t.Helper()
	ln, err := n.backendNS.Listen("tcp", netip.AddrPortFrom(n.ip.backend, port).String())
	if err != nil {
		t.Fatal(err)
	}
	b := serveEcho(t, ln)
	return Backend{Address: n.ip.backend.String(), Port: port, Owner: fmt.Sprintf("node-%d", port)}, b
}

func (n *engineNet) dial(t *testing.T, port uint16) (net.Conn, error) {
	t.Helper()
	return n.dialWithin(t, port, 2000)
}

// dialWithin dials the frontend's port from the client, giving up after
// ms milliseconds.
func (n *engineNet) dialWithin(t *testing.T, port uint16, ms int) (net.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(ms)*time.Millisecond)
	defer cancel()
	return n.client.DialContext(ctx, "tcp", netip.AddrPortFrom(n.ip.frontend, port).String())
}

// established opens count connections from the client, each with one
// round trip done, closed when the test ends.
func (n *engineNet) established(t *testing.T, port uint16, count int) []net.Conn {
	t.Helper()
	var out []net.Conn
	for range count {
		c, err := n.dial(t, port)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if err := roundTrip(c, []byte("x")); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// roundTripNew opens a connection from the client, does one round trip
// and closes it.
func (n *engineNet) roundTripNew(t *testing.T, port uint16) error {
	t.Helper()
	c, err := n.dial(t, port)
	if err != nil {
		return err
	}
	defer c.Close()
	return roundTrip(c, []byte("hello"))
}

func (n *engineNet) frontendOn(port uint16, backends ...Backend) Frontend {
	return Frontend{Name: fmt.Sprintf("fe-%d", port), Address: n.ip.frontend.String(), Port: port, Backends: backends}
}

// forEachEngine runs test against each engine, over IPv4.
func forEachEngine(t *testing.T, test func(t *testing.T, n *engineNet)) {
	for _, v := range engineVariants {
		t.Run(v.String(), func(t *testing.T) { test(t, newEngineNetOn(t, v, "IPv4")) })
	}
}

// forEachEngineAndFamily runs test against each engine, over IPv4 and
// over IPv6.
// The eBPF kernel path forwards IPv4 only: over IPv6 it is checked to
// refuse the frontend instead.
func forEachEngineAndFamily(t *testing.T, test func(t *testing.T, n *engineNet)) {
	for _, v := range engineVariants {
		for _, family := range []string{"IPv4", "IPv6"} {
			t.Run(v.String()+"/"+family, func(t *testing.T) {
				n := newEngineNetOn(t, v, family)
				if v.path == KernelPathEBPF && family == "IPv6" {
					a, _ := n.echo(t, 8080)
					n.rejects(t, n.frontendOn(80, a), "forwards IPv4 only")
					return
				}
				test(t, n)
			})
		}
	}
}

// New connections are spread over the backends and echo; the backend sees
// the load balancer's address, not the client's (both engines translate
// the source).
func TestEnginesSpreadAndTranslate(t *testing.T) {
	forEachEngineAndFamily(t, func(t *testing.T, n *engineNet) {
		a, sa := n.echo(t, 8080)
		b, sb := n.echo(t, 8081)
		n.apply(t, n.frontendOn(80, a, b))
		for i := range 10 {
			if err := n.roundTripNew(t, 80); err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
		}
		if sa.accepted.Load() != 5 || sb.accepted.Load() != 5 {
			t.Errorf("10 connections split %d/%d, want 5/5 (round robin)", sa.accepted.Load(), sb.accepted.Load())
		}
		if from := sa.lastPeer(); from.Addr() != n.ip.lbToBackend {
			t.Errorf("the backend saw the client as %s, want the load balancer's %s", from, n.ip.lbToBackend)
		}
	})
}

// Admin Down: established connections continue, new ones go elsewhere;
// every backend Down: a new connection is reset at once.
func TestEnginesAdminDown(t *testing.T) {
	forEachEngineAndFamily(t, func(t *testing.T, n *engineNet) {
		a, sa := n.echo(t, 8080)
		b, sb := n.echo(t, 8081)
		n.apply(t, n.frontendOn(80, a, b))
		open := n.established(t, 80, 2)
		if _, err := n.d.SetOwnerAdminState(a.Owner, AdminDown); err != nil {
			t.Fatal(err)
		}
		before := sa.accepted.Load()
		for i := range 6 {
			if err := n.roundTripNew(t, 80); err != nil {
				t.Fatalf("new connection %d with one backend Down: %v", i, err)
			}
		}
		if sa.accepted.Load() != before {
			t.Errorf("the Down backend took %d new connections", sa.accepted.Load()-before)
		}
		for i, c := range open {
			if err := roundTrip(c, []byte("still there")); err != nil {
				t.Errorf("established connection %d broke when its backend went Down: %v", i, err)
			}
		}
		if _, err := n.d.SetOwnerAdminState(b.Owner, AdminDown); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err := n.roundTripNew(t, 80)
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
			t.Errorf("with every backend Down: %v, want a refusal or reset", err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("the refusal took %s", took)
		}
		_ = sb
	})
}

// Nodes that leave and come back one right after another (faster than the
// kernel engine prepares its entries for the next change): new
// connections always go to exactly the nodes that are not Down.
func TestEnginesNodesLeaveAndComeBackInQuickSuccession(t *testing.T) {
	forEachEngine(t, func(t *testing.T, n *engineNet) {
		var backends []Backend
		var servers []*testBackend
		for port := range uint16(3) {
			b, s := n.echo(t, 8080+port)
			backends, servers = append(backends, b), append(servers, s)
		}
		n.apply(t, n.frontendOn(80, backends...))
		for _, step := range []struct {
			owner int
			state AdminState
			want  []bool // which backends take new connections after it
		}{
			{0, AdminDown, []bool{false, true, true}},
			{1, AdminDown, []bool{false, false, true}},
			{0, AdminNone, []bool{true, false, true}},
			{2, AdminDown, []bool{true, false, false}},
			{1, AdminNone, []bool{true, true, false}},
			{2, AdminNone, []bool{true, true, true}},
		} {
			if _, err := n.d.SetOwnerAdminState(backends[step.owner].Owner, step.state); err != nil {
				t.Fatal(err)
			}
			var before []int64
			for _, s := range servers {
				before = append(before, s.accepted.Load())
			}
			for i := range 12 {
				if err := n.roundTripNew(t, 80); err != nil {
					t.Fatalf("after %s of backend %d: new connection %d: %v", step.state, step.owner, i, err)
				}
			}
			for j, s := range servers {
				if took := s.accepted.Load() - before[j]; (took > 0) != step.want[j] {
					t.Errorf("after %s of backend %d: backend %d took %d of 12 new connections, want some: %t", step.state, step.owner, j, took, step.want[j])
				}
			}
		}
	})
}

// Source ranges: only the listed prefixes are served, others are refused.
func TestEnginesSourceRanges(t *testing.T) {
	forEachEngineAndFamily(t, func(t *testing.T, n *engineNet) {
		a, _ := n.echo(t, 8080)
		allowed := n.frontendOn(80, a)
		allowed.SourceRanges = []string{netip.PrefixFrom(n.ip.client, n.ip.client.BitLen()-8).Masked().String()}
		denied := n.frontendOn(81, a)
		denied.SourceRanges = []string{"10.3.0.0/16", "192.0.2.0/24", "fd00:3::/64"}
		// Ranges of the other family only: a range lets nobody of the
		// frontend's family in (issue 50 item 13: the eBPF path let
		// everyone in).
		otherFamily := n.frontendOn(82, a)
		otherFamily.SourceRanges = []string{"2001:db8::/32"}
		if n.ip.client.Is6() {
			otherFamily.SourceRanges = []string{"0.0.0.0/0"}
		}
		n.apply(t, allowed, denied, otherFamily)
		if err := n.roundTripNew(t, 80); err != nil {
			t.Errorf("a client in the source range: %v", err)
		}
		if err := n.roundTripNew(t, 81); err == nil {
			t.Error("a client outside the source ranges was served")
		}
		if err := n.roundTripNew(t, 82); err == nil {
			t.Errorf("a client was served by a frontend whose only source range (%s) is of the other family", otherFamily.SourceRanges[0])
		}
	})
}

// Weights: a backend of weight 2 takes twice the new connections.
func TestEnginesWeights(t *testing.T) {
	forEachEngine(t, func(t *testing.T, n *engineNet) {
		a, sa := n.echo(t, 8080)
		b, sb := n.echo(t, 8081)
		a.Weight = 2
		n.apply(t, n.frontendOn(80, a, b))
		for i := range 9 {
			if err := n.roundTripNew(t, 80); err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
		}
		if sa.accepted.Load() != 6 || sb.accepted.Load() != 3 {
			t.Errorf("9 connections split %d/%d, want 6/3 for weights 2 and 1", sa.accepted.Load(), sb.accepted.Load())
		}
	})
}

// A backend removed from the configuration drains: its established
// connections continue, it gets no new ones.
func TestEnginesRemovedBackendDrains(t *testing.T) {
	forEachEngine(t, func(t *testing.T, n *engineNet) {
		a, sa := n.echo(t, 8080)
		b, _ := n.echo(t, 8081)
		n.apply(t, n.frontendOn(80, a))
		c := n.established(t, 80, 1)[0]
		n.apply(t, n.frontendOn(80, b))
		for i := range 4 {
			if err := n.roundTripNew(t, 80); err != nil {
				t.Fatalf("new connection %d after the removal: %v", i, err)
			}
		}
		if sa.accepted.Load() != 1 {
			t.Errorf("the removed backend took %d new connections", sa.accepted.Load()-1)
		}
		if err := roundTrip(c, []byte("still there")); err != nil {
			t.Errorf("the removed backend's established connection broke: %v", err)
		}
	})
}

// A backend whose probe fails stops getting new connections, in the kernel
// engine too (the probe, in user space, rewrites the kernel's map). Each
// backend is probed on a port of its own, so that probes are not counted
// as connections and the failing backend still accepts traffic: only its
// probe can keep connections away from it.
func TestEnginesProbeTakesABackendOut(t *testing.T) {
	forEachEngine(t, func(t *testing.T, n *engineNet) {
		a, sa := n.echo(t, 8080)
		b, sb := n.echo(t, 8081)
		_, healthA := n.echo(t, 9080)
		n.echo(t, 9081)
		a.ProbePort, b.ProbePort = 9080, 9081
		fe := n.frontendOn(80, a, b)
		// A short interval, but a timeout long enough that a busy machine
		// does not fail the healthy backend's probe.
		fe.HealthCheck = &HealthCheck{Protocol: ProbeTCP, Interval: Duration{100 * time.Millisecond}, Timeout: Duration{2 * time.Second}, UnhealthyThreshold: 1, HealthyThreshold: 1}
		n.apply(t, fe)
		_ = healthA.ln.Close() // a's probe fails; a itself still answers
		waitFor(t, "backend a's probe to fail and take it out", func() bool {
			for _, s := range n.d.Status() {
				if s.Address.Port() == 8080 {
					return !s.Eligible
				}
			}
			return false
		})
		beforeA, beforeB := sa.accepted.Load(), sb.accepted.Load()
		for i := range 4 {
			if err := n.roundTripNew(t, 80); err != nil {
				t.Fatalf("connection %d with backend a unhealthy: %v", i, err)
			}
		}
		if gotA, gotB := sa.accepted.Load()-beforeA, sb.accepted.Load()-beforeB; gotA != 0 || gotB != 4 {
			t.Errorf("4 new connections went %d to the unhealthy backend and %d to the healthy one, want 0 and 4", gotA, gotB)
		}
	})
}

// UDP datagrams reach a backend and the answers come back.
func TestEnginesUDP(t *testing.T) {
	forEachEngineAndFamily(t, func(t *testing.T, n *engineNet) {
		pc, err := n.backendNS.ListenPacket("udp", netip.AddrPortFrom(n.ip.backend, 5353).String())
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
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
		fe := n.frontendOn(53, Backend{Address: n.ip.backend.String(), Port: 5353})
		fe.Protocol = UDP
		if n.path == KernelPathEBPF {
			n.rejects(t, fe, "forwards TCP only")
			return
		}
		n.apply(t, fe)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := n.client.DialContext(ctx, "udp", netip.AddrPortFrom(n.ip.frontend, 53).String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// The first datagram of a fresh IPv6 network is now and then lost
		// before it reaches any socket (neighbour discovery; a plain UDP
		// server on the same address loses it too): resend it, as a UDP
		// client would, until one comes back.
		warm := false
		for range 5 {
			if warm = roundTripWithin(c, []byte("warm-up"), 500*time.Millisecond) == nil; warm {
				break
			}
		}
		if !warm {
			t.Fatal("no datagram came back through the load balancer")
		}
		for i := range 3 {
			if err := datagramRoundTrip(c, fmt.Sprintf("datagram %d", i)); err != nil {
				t.Fatalf("datagram %d: %v", i, err)
			}
		}
	})
}

// A restart of the data plane: the kernel engine's flows survive it (the
// kernel holds them, and the table stays until the next data plane
// replaces it); the proxy engine's cannot, its process holds them.
func TestEnginesRestart(t *testing.T) {
	forEachEngine(t, func(t *testing.T, n *engineNet) {
		a, _ := n.echo(t, 8080)
		n.apply(t, n.frontendOn(80, a))
		c := n.established(t, 80, 1)[0]
		if err := n.d.Close(); err != nil {
			t.Fatal(err)
		}
		err := roundTrip(c, []byte("during the restart"))
		switch n.engine {
		case EngineKernel:
			if err != nil {
				t.Errorf("an established flow broke while the data plane was down: %v", err)
			}
			if err := n.roundTripNew(t, 80); err != nil {
				t.Errorf("a new flow while the data plane was down: %v", err)
			}
		case EngineProxy:
			if err == nil {
				t.Error("the proxy engine kept a connection after Close; this test's premise is wrong")
			}
		}
		n.d = newDataPlane(t, n.options())
		n.apply(t, n.frontendOn(80, a))
		if err := n.roundTripNew(t, 80); err != nil {
			t.Errorf("a new connection after the restart: %v", err)
		}
		if n.engine == EngineKernel {
			if err := roundTrip(c, []byte("after the restart")); err != nil {
				t.Errorf("an established flow broke when the new data plane replaced the table: %v", err)
			}
		}
	})
}

// Auto picks the kernel for a frontend that needs nothing only the proxy
// can do, the proxy otherwise; Kernel asked for a proxy-only feature is
// refused with the reason.
func TestEngineChoice(t *testing.T) {
	n := newEngineNet(t, EngineAuto, "IPv4")
	a, _ := n.echo(t, 8080)
	plain := n.frontendOn(80, a)
	proxied := n.frontendOn(81, a)
	proxied.ProxyProtocol = true
	n.apply(t, plain, proxied)
	n.expectKernelServesOnly(t, plain.Name)
	if err := n.roundTripNew(t, 80); err != nil {
		t.Errorf("through the kernel engine: %v", err)
	}

	bad := proxied
	bad.Engine = EngineKernel
	_, err := Config{Frontends: []Frontend{bad}}.Validate()
	if err == nil || !strings.Contains(err.Error(), "proxyProtocol needs the proxy engine") {
		t.Errorf("Kernel with proxyProtocol: %v; want an error saying it needs the proxy engine", err)
	}
}

// A removed frontend takes no new connection at once; its established
// ones continue.
func TestEnginesRemovedFrontend(t *testing.T) {
	forEachEngine(t, func(t *testing.T, n *engineNet) { removedFrontendDrains(t, n) })
}

// removedFrontendDrains removes a frontend with a connection established
// through it, checks that the connection continues and a new one is not
// served, and returns the connection.
func removedFrontendDrains(t *testing.T, n *engineNet) net.Conn {
	t.Helper()
	a, _ := n.echo(t, 8080)
	n.apply(t, n.frontendOn(80, a))
	c := n.established(t, 80, 1)[0]
	n.apply(t)
	if err := roundTrip(c, []byte("after the removal")); err != nil {
		t.Fatalf("the established connection broke when its frontend was removed: %v", err)
	}
	if err := n.roundTripNew(t, 80); err == nil {
		t.Error("a new connection to the removed frontend was served")
	}
	return c
}

// A removed backend's established connections end at the drain timeout.
func TestEnginesDrainTimeout(t *testing.T) {
	forEachEngineAndFamily(t, func(t *testing.T, n *engineNet) {
		a, _ := n.echo(t, 8080)
		b, _ := n.echo(t, 8081)
		fe := n.frontendOn(80, a)
		fe.DrainTimeout.Duration = 300 * time.Millisecond
		n.apply(t, fe)
		c := n.established(t, 80, 1)[0]
		fe.Backends = []Backend{b}
		n.apply(t, fe)
		if err := roundTrip(c, []byte("within the drain timeout")); err != nil {
			t.Fatalf("right after the removal: %v", err)
		}
		waitFor(t, "the connection to end at the drain timeout", func() bool { return roundTrip(c, []byte("later")) != nil })
	})
}

// Status counts each backend's established connections while they last,
// in the kernel engine from connection tracking (NodeMaintenance waits on
// this count through the load balancers' reports).
func TestEnginesCountActiveConnections(t *testing.T) {
	forEachEngineAndFamily(t, func(t *testing.T, n *engineNet) {
		a, _ := n.echo(t, 8080)
		n.apply(t, n.frontendOn(80, a))
		open := n.established(t, 80, 3)
		active := func() int64 {
			var sum int64
			for _, s := range n.d.Status() {
				sum += s.Active
			}
			return sum
		}
		waitFor(t, "3 active connections", func() bool { return active() == 3 })
		for _, c := range open {
			_ = c.Close()
		}
		waitFor(t, "no active connection once they closed", func() bool { return active() == 0 })
		if n.path == KernelPathEBPF {
			// Ended flows leave the table with their last segment, so
			// that its LRU never evicts a live one for them.
			n.waitFlowTableEmpty(t)
		}
	})
}

// The kernel engine serves IPv4 and IPv6 frontends at once (two tables,
// one transaction), and refuses a frontend whose backends are of the other
// family.
func TestKernelEngineServesBothFamiliesAtOnce(t *testing.T) {
	n := newEngineNet(t, EngineKernel, "IPv4")
	v4, v6 := n.ip, plans["IPv6"]
	a, _ := n.echo(t, 8080)
	n.ip = v6
	b, _ := n.echo(t, 8080)
	fe6 := n.frontendOn(80, b)
	fe6.Name = "fe-80-v6"
	n.ip = v4
	n.apply(t, n.frontendOn(80, a), fe6)
	for _, plan := range []addressPlan{v4, v6} {
		n.ip = plan
		if err := n.roundTripNew(t, 80); err != nil {
			t.Errorf("through %s: %v", plan.frontend, err)
		}
	}

	mixed := Frontend{Name: "mixed", Address: v4.frontend.String(), Port: 81, Engine: EngineKernel, Backends: []Backend{b}}
	if _, err := (Config{Frontends: []Frontend{mixed}}).Validate(); err == nil || !strings.Contains(err.Error(), "other address family") {
		t.Errorf("an IPv4 kernel frontend with an IPv6 backend: %v; want an error naming the address family", err)
	}
}

// ClientIP: every new connection of a client goes to one backend; when
// that backend goes Down, the client moves to one other backend and stays
// there.
func TestEnginesClientIPAffinity(t *testing.T) {
	forEachEngineAndFamily(t, func(t *testing.T, n *engineNet) {
		var servers []*testBackend
		var backends []Backend
		for port := uint16(8080); port < 8084; port++ {
			b, s := n.echo(t, port)
			backends, servers = append(backends, b), append(servers, s)
		}
		fe := n.frontendOn(80, backends...)
		fe.Balancing = ClientIP
		n.apply(t, fe)
		only := func(what string) int {
			t.Helper()
			before := make([]int64, len(servers))
			for i, s := range servers {
				before[i] = s.accepted.Load()
			}
			for i := range 8 {
				if err := n.roundTripNew(t, 80); err != nil {
					t.Fatalf("%s: connection %d: %v", what, i, err)
				}
			}
			chosen := -1
			for i, s := range servers {
				if got := s.accepted.Load() - before[i]; got == 8 {
					chosen = i
				} else if got != 0 {
					t.Fatalf("%s: backend %d took %d of 8 connections of one client; want all or none", what, i, got)
				}
			}
			return chosen
		}
		first := only("affinity")
		if _, err := n.d.SetOwnerAdminState(backends[first].Owner, AdminDown); err != nil {
			t.Fatal(err)
		}
		if moved := only("after its backend went Down"); moved == first {
			t.Errorf("the client stayed on backend %d, which is Down", first)
		}
	})
}

// The kernel engine's transactions are counted by kind: a configuration
// rebuilds the tables, a node's admin-state change on the fast path
// changes its state in the owners map only.
func TestKernelEngineSyncMetrics(t *testing.T) {
	n := newEngineNet(t, EngineKernel, "IPv4")
	a, _ := n.echo(t, 8080)
	b, _ := n.echo(t, 8081)
	n.apply(t, n.frontendOn(80, a, b))
	if _, err := n.d.SetOwnerAdminState(a.Owner, AdminDown); err != nil {
		t.Fatal(err)
	}
	got := kernelSyncCounts(t, n.reg)
	if got["rebuild"] != 1 || got["owners"] != 1 || got["entries"] != 0 {
		t.Errorf("kernel syncs by kind %v, want one rebuild (the apply) and one owners (the admin state)", got)
	}
}

// expectKernelServesOnly checks that the kernel engine serves the frontend
// named name and the proxy every other.
func (n *engineNet) expectKernelServesOnly(t *testing.T, name string) {
	t.Helper()
	n.d.mu.Lock()
	defer n.d.mu.Unlock()
	for _, f := range n.d.frontends {
		if want := f.set.Load().cfg.Name == name; f.kernel != want {
			t.Errorf("frontend %s: kernel engine %v, want %v", f.set.Load().cfg.Name, f.kernel, want)
		}
	}
}

// waitFlowTableEmpty waits until the eBPF path's flows and replies maps
// are empty: every flow of the test's closed connections left them.
func (n *engineNet) waitFlowTableEmpty(t *testing.T) {
	t.Helper()
	e := n.d.kernel.(*ebpfPath)
	waitFor(t, "the closed connections' flows to leave the table", func() bool {
		e.use.RLock()
		defer e.use.RUnlock()
		flows, replies := 0, 0
		_ = e.eachFlow(func(bpfTuple, bpfFlow) { flows++ })
		for _, table := range e.flowTables() {
			_ = eachElement(table.replies, func(bpfTuple, bpfReply) { replies++ })
		}
		return flows == 0 && replies == 0
	})
}

// kernelSyncCounts is the kernel engine's transactions so far, by kind.
func kernelSyncCounts(t *testing.T, reg *prometheus.Registry) map[string]uint64 {
	t.Helper()
	got := map[string]uint64{}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "ebb_dataplane_kernel_sync_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
		}
	}
	return got
}

// roundTripWithin writes msg and reads a datagram back within d.
func roundTripWithin(c net.Conn, msg []byte, d time.Duration) error {
	if _, err := c.Write(msg); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1500))
	return err
}

// datagramRoundTrip writes msg and waits up to 2 s for its echo, skipping
// late echoes of earlier (warm-up) datagrams.
func datagramRoundTrip(c net.Conn, msg string) error {
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 1500)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return err
		}
		if string(buf[:n]) == msg {
			return nil
		}
	}
}
