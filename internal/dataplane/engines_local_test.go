package dataplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// A backend at an address of the load balancer's own host (its node, when
// the LB host is also a node: the Service's node port there) gets its
// share of new connections, each answered at its first SYN, beside a
// backend on another host; on the eBPF path such flows go through the
// host's stack (only their destination translated, their replies
// translated back at egress), and leave the flow table when they close.
func TestEnginesBackendOnTheLBHost(t *testing.T) {
	forEachEngine(t, func(t *testing.T, n *engineNet) {
		remote, remoteServer := n.echo(t, 8080)
		ln, err := n.lb.Listen("tcp", netip.AddrPortFrom(n.ip.lbToBackend, 9000).String())
		if err != nil {
			t.Fatal(err)
		}
		localServer := serveEcho(t, ln)
		local := Backend{Address: n.ip.lbToBackend.String(), Port: 9000, Owner: "lb-host"}
		n.apply(t, n.frontendOn(80, remote, local))
		const conns = 8
		for i := range conns {
			// One SYN each: the dial's 2 s would hide a dropped first SYN
			// (retried after 1 s), a deadline under that does not.
			c, err := n.dialWithin(t, 80, 700)
			if err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
			if err := roundTrip(c, []byte(fmt.Sprint("hello ", i))); err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
			_ = c.Close()
		}
		l, r := localServer.accepted.Load(), remoteServer.accepted.Load()
		if l+r != conns || l == 0 || r == 0 {
			t.Errorf("the backend on the LB host took %d connections and the other %d; want %d in all, some each", l, r, conns)
		}
		if n.path == KernelPathEBPF {
			n.waitFlowTableEmpty(t)
		}
	})
}

// A backend that is the load balancer's host's own node port, which
// kube-proxy translates on to a pod (here: a rule of the test's, as
// kube-proxy's nftables mode writes it, to a server on the backend host):
// new connections reach the pod through it, each at its first SYN, the
// replies come back from the frontend's address, and Status counts the
// connections open to it, though their replies come from the pod. (The
// nftables path once translated the flow to the node port itself, and
// kube-proxy's translation, a flow's second, never applied: a third of
// the connections in the local cluster were refused.)
func TestEnginesBackendIsTheLBHostsNodePort(t *testing.T) {
	forEachEngineAndFamily(t, func(t *testing.T, n *engineNet) {
		remote, remoteServer := n.echo(t, 8080)
		_, pod := n.echo(t, 8081)
		nodePort := netip.AddrPortFrom(n.ip.lbToBackend, 30080)
		n.serveNodePort(t, nodePort, netip.AddrPortFrom(n.ip.backend, 8081))
		local := Backend{Address: nodePort.Addr().String(), Port: nodePort.Port(), Owner: "lb-host"}
		n.apply(t, n.frontendOn(80, remote, local))
		const conns = 8
		var open []net.Conn
		for i := range conns {
			c, err := n.dialWithin(t, 80, 700)
			if err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
			defer c.Close()
			if err := roundTrip(c, []byte(fmt.Sprint("hello ", i))); err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
			if got := c.RemoteAddr().String(); got != netip.AddrPortFrom(n.ip.frontend, 80).String() {
				t.Errorf("connection %d answered from %s, want the frontend's address", i, got)
			}
			open = append(open, c)
		}
		p, r := pod.accepted.Load(), remoteServer.accepted.Load()
		if p+r != conns || p == 0 || r == 0 {
			t.Fatalf("the node port's pod took %d connections and the other backend %d; want %d in all, some each", p, r, conns)
		}
		activeOn := func(b netip.AddrPort) int64 {
			for _, s := range n.d.Status() {
				if s.Address == b {
					return s.Active
				}
			}
			return -1
		}
		waitFor(t, fmt.Sprintf("%d connections counted on the node port", p), func() bool { return activeOn(nodePort) == p })
		for _, c := range open {
			_ = c.Close()
		}
		waitFor(t, "no connection counted on the node port once they closed", func() bool { return activeOn(nodePort) == 0 })
	})
}

// serveNodePort makes the load balancer's host translate flows to
// nodePort on to pod, as kube-proxy's nftables mode serves a node port:
// a NAT chain at dstnat priority (prerouting and output), masquerade.
func (n *engineNet) serveNodePort(t *testing.T, nodePort, pod netip.AddrPort) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(n.lb.NetNS()))
	if err != nil {
		t.Fatal(err)
	}
	fam := familyOf(nodePort.Addr())
	table := c.AddTable(&nftables.Table{Name: "kube-proxy", Family: fam.table})
	r := kernelRuleset{fam: fam, table: table, conn: c}
	const kubeProxyMark = 0x4000
	for _, hook := range []*nftables.ChainHook{nftables.ChainHookPrerouting, nftables.ChainHookOutput} {
		ch := c.AddChain(&nftables.Chain{Name: fmt.Sprint("nat-", *hook), Table: table, Type: nftables.ChainTypeNAT, Hooknum: hook, Priority: nftables.ChainPriorityNATDest})
		exprs := append(r.matchDestination(nodePort.Addr()), matchL4(TCP, nodePort.Port())...)
		exprs = append(exprs,
			&expr.Immediate{Register: 2, Data: u32(kubeProxyMark)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 2},
			&expr.Immediate{Register: 1, Data: pod.Addr().AsSlice()},
			&expr.Immediate{Register: 3, Data: binaryutil.BigEndian.PutUint16(pod.Port())},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam.nfproto, RegAddrMin: 1, RegProtoMin: 3, Specified: true},
		)
		c.AddRule(&nftables.Rule{Table: table, Chain: ch, Exprs: exprs})
	}
	post := c.AddChain(&nftables.Chain{Name: "nat-postrouting", Table: table, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: table, Chain: post, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: u32(kubeProxyMark)},
		&expr.Masq{},
	}})
	if err := c.Flush(); err != nil {
		t.Fatalf("adding kube-proxy's node port rules: %v", err)
	}
}

// stopNodePort removes the node port rules serveNodePort added.
func (n *engineNet) stopNodePort(t *testing.T, addr netip.Addr) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(n.lb.NetNS()))
	if err != nil {
		t.Fatal(err)
	}
	c.DelTable(&nftables.Table{Name: "kube-proxy", Family: familyOf(addr).table})
	if err := c.Flush(); err != nil {
		t.Fatalf("removing kube-proxy's node port rules: %v", err)
	}
}

// A client behind an interface that appeared after the data plane
// started (a pod's veth on an LB host that is a node, a VLAN made later)
// is served; on the eBPF path the interface's
// attachments are pinned when it appears and unpinned when it goes.
// (The eBPF path once attached to the interfaces there at its start only:
// such a client's connection found no listener and was refused.)
func TestEnginesServeAnInterfaceAddedLater(t *testing.T) {
	forEachEngine(t, func(t *testing.T, n *engineNet) {
		a, _ := n.echo(t, 8080)
		n.apply(t, n.frontendOn(80, a))
		if err := n.roundTripNew(t, 80); err != nil {
			t.Fatal(err)
		}
		late, err := network.NewHost("late-client")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(late.Close)
		pfx := netip.MustParsePrefix
		if err := network.LinkHosts(n.lb, "to-late", []netip.Prefix{pfx("10.3.0.1/24")}, late, "eth0", []netip.Prefix{pfx("10.3.0.2/24")}); err != nil {
			t.Fatal(err)
		}
		if err := late.AddRoute(pfx("10.9.0.0/24"), netip.MustParseAddr("10.3.0.1")); err != nil {
			t.Fatal(err)
		}
		pins := func() []string {
			dir, err := newEBPFPath(n.options()).pinDirectory()
			if err != nil {
				t.Fatal(err)
			}
			got, _ := filepath.Glob(filepath.Join(dir, "*-to-late"))
			return got
		}
		if n.path == KernelPathEBPF {
			waitFor(t, "the new interface's attachments pinned", func() bool { return len(pins()) == 2 })
		}
		// 2 s for each connection: the first SYN on a link just made may
		// go before its carrier is up. The bug this guards against
		// refused the connection at once.
		for i := range 4 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			c, err := late.DialContext(ctx, "tcp", netip.AddrPortFrom(n.ip.frontend, 80).String())
			cancel()
			if err != nil {
				t.Fatalf("connection %d from the new interface: %v", i, err)
			}
			err = roundTrip(c, []byte(fmt.Sprint("late ", i)))
			_ = c.Close()
			if err != nil {
				t.Fatalf("connection %d from the new interface: %v", i, err)
			}
		}
		late.Close() // its end of the link goes, and so does the other
		if n.path == KernelPathEBPF {
			waitFor(t, "the gone interface's attachments unpinned", func() bool { return len(pins()) == 0 })
		}
		if err := n.roundTripNew(t, 80); err != nil {
			t.Errorf("after the new interface went: %v", err)
		}
	})
}
