package main

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"runtime"
	"sync/atomic"

	"github.com/vishvananda/netns"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// topology is where the benchmark's parts run. In "loopback" the client,
// the backends and the load balancer share this process's network
// namespace and every packet goes through lo. In "routed", the case of a
// real load balancer, each is a host of its own (a network namespace),
// joined by veth pairs, and the load balancer's host routes between the
// client's subnet and the backends':
//
//	client 10.77.1.2 ── 10.77.1.1 lb 10.77.2.1 ── 10.77.2.2 backends
//
// The direct runs then go client to backend through the load balancer's
// host (forwarded, not translated), so that what a contender adds is what
// it costs beyond routing.
type topology struct {
	name string
	// client, lb and backends are the hosts of the routed topology; nil in
	// loopback.
	client, lb, backends *network.Host
	nextPort             atomic.Int32
}

// The routed topology's addresses; 10.77.0.0/16 is used by nothing else
// on the machine, and lives only inside the namespaces made here.
var (
	routedClient   = netip.MustParsePrefix("10.77.1.2/24")
	routedLBFront  = netip.MustParsePrefix("10.77.1.1/24")
	routedLBBack   = netip.MustParsePrefix("10.77.2.1/24")
	routedBackends = netip.MustParsePrefix("10.77.2.2/24")
	// routedDirect is the client's source address for the direct runs.
	routedDirect = netip.MustParsePrefix("10.77.1.3/24")
)

// newTopology builds the named topology.
func newTopology(name string) (*topology, error) {
	t := &topology{name: name}
	t.nextPort.Store(20000)
	switch name {
	case "loopback":
		return t, nil
	case "routed":
		if err := t.buildRouted(); err != nil {
			t.close()
			return nil, fmt.Errorf("building the routed topology: %w", err)
		}
		return t, nil
	}
	return nil, fmt.Errorf("unknown topology %q (loopback or routed)", name)
}

func (t *topology) buildRouted() error {
	var err error
	if t.client, err = network.NewHost("bench-client"); err != nil {
		return err
	}
	if t.lb, err = network.NewHost("bench-lb"); err != nil {
		return err
	}
	if t.backends, err = network.NewHost("bench-backends"); err != nil {
		return err
	}
	if err := network.LinkHosts(t.lb, "eth0", []netip.Prefix{routedLBFront}, t.client, "eth0", []netip.Prefix{routedClient, routedDirect}); err != nil {
		return err
	}
	if err := network.LinkHosts(t.lb, "eth1", []netip.Prefix{routedLBBack}, t.backends, "eth0", []netip.Prefix{routedBackends}); err != nil {
		return err
	}
	anyV4 := netip.MustParsePrefix("0.0.0.0/0")
	if err := t.client.AddRoute(anyV4, routedLBFront.Addr()); err != nil {
		return err
	}
	// Direct connections (to a backend) leave from an address of their
	// own: a load balancer that keeps its own flow table without
	// translating the source (the minimal eBPF NAT) would otherwise take a
	// direct connection's replies for those of an earlier flow of the
	// same client port that it sent to the same backend. A route's
	// preferred source, not a bind, so that ports in TIME_WAIT are reused
	// as for any other connection.
	if err := t.client.AddRouteFrom(routedBackends.Masked(), routedLBFront.Addr(), routedDirect.Addr()); err != nil {
		return err
	}
	if err := t.backends.AddRoute(anyV4, routedLBBack.Addr()); err != nil {
		return err
	}
	for _, s := range []struct {
		h           *network.Host
		name, value string
	}{
		{t.lb, "net/ipv4/ip_forward", "1"},
		// Without reuse, a client making thousands of connections a
		// second runs out of ephemeral ports in TIME_WAIT within
		// seconds (on loopback the kernel's default already reuses).
		{t.client, "net/ipv4/tcp_tw_reuse", "1"},
		{t.lb, "net/ipv4/tcp_tw_reuse", "1"},
	} {
		if err := s.h.SetSysctl(s.name, s.value); err != nil {
			return err
		}
	}
	return nil
}

func (t *topology) close() {
	for _, h := range []*network.Host{t.client, t.lb, t.backends} {
		if h != nil {
			h.Close()
		}
	}
}

// frontend is an address and port for a contender's frontend, free in
// this run.
func (t *topology) frontend() string {
	if t.lb == nil {
		return freeAddr()
	}
	return netip.AddrPortFrom(routedLBFront.Addr(), uint16(t.nextPort.Add(1))).String()
}

// lbLocal is an address for the load balancer's own servers (metrics,
// pprof), which only this benchmark reaches, through lbHTTP.
func (t *topology) lbLocal() string {
	if t.lb == nil {
		return freeAddr()
	}
	return fmt.Sprintf("127.0.0.1:%d", t.nextPort.Add(1))
}

// lbHTTP is an HTTP client that reaches the load balancer's host.
func (t *topology) lbHTTP() *http.Client {
	if t.lb == nil {
		return http.DefaultClient
	}
	return &http.Client{Transport: &http.Transport{DialContext: t.lb.DialContext}}
}

// startLB starts a contender's process on the load balancer's host.
func (t *topology) startLB(cmd *exec.Cmd) error {
	if t.lb == nil {
		return cmd.Start()
	}
	return t.lb.Start(cmd)
}

// lbNetNS is the load balancer host's network namespace for libraries
// that program it from outside (nftables); 0 is this process's.
func (t *topology) lbNetNS() int {
	if t.lb == nil {
		return 0
	}
	return t.lb.NetNS()
}

// listenBackend opens an echo backend's listener.
func (t *topology) listenBackend() (net.Listener, error) {
	if t.backends == nil {
		return net.Listen("tcp", "127.0.0.1:0")
	}
	return t.backends.Listen("tcp", netip.AddrPortFrom(routedBackends.Addr(), 0).String())
}

// dialer is how the client's host connects.
func (t *topology) dialer() *net.Dialer {
	return &net.Dialer{Timeout: opTimeout}
}

// dial connects from the client's host.
func (t *topology) dial(addr string) (net.Conn, error) {
	if t.client == nil {
		return t.dialer().Dial("tcp", addr)
	}
	var c net.Conn
	err := t.client.Do(func() (err error) {
		c, err = t.dialer().Dial("tcp", addr)
		return err
	})
	return c, err
}

// asClient runs fn on this goroutine with its thread in the client's
// network namespace, so that the sockets fn opens (with net.Dial) are the
// client's; a load's workers each enter once rather than on every dial.
// The thread is put back and unlocked afterwards.
func (t *topology) asClient(fn func()) {
	if t.client == nil {
		fn()
		return
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		panic(fmt.Sprintf("opening this thread's network namespace: %v", err))
	}
	defer orig.Close()
	if err := netns.Set(netns.NsHandle(t.client.NetNS())); err != nil {
		panic(fmt.Sprintf("entering the client's network namespace: %v", err))
	}
	fn()
	if err := netns.Set(orig); err != nil {
		// Leave the thread locked: the runtime retires it with the
		// goroutine rather than reuse it in the wrong namespace.
		return
	}
	runtime.UnlockOSThread()
}
