package dataplane

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// A client that opens a new connection from the port of one whose end
// the kernel path never saw (its last segments went through another LB
// host, or were lost) is served by an eligible backend. On the eBPF path
// the SYN's sequence number is not the old flow's, so it opens a new flow
// at once; on the nftables path conntrack holds the old flow as
// established, so the SYN is dropped and the stale entry deleted, and the
// client's retransmitted SYN (1 s later) opens a new flow. (Before, the
// old flow took the SYN to the old connection's backend: here one that no
// longer takes new connections and has forgotten the old one, as the node
// port of a deleted Service whose address a new one took; it refused the
// connection.)
func TestKernelPathsServeAReusedPortWhoseFlowTheyNeverSawEnd(t *testing.T) {
	for _, c := range []struct {
		v      engineVariant
		family string
		// local puts the old connection's backend on the LB host (a
		// FLOW_LOCAL flow on the eBPF path).
		local bool
	}{
		{engineVariant{engine: EngineKernel}, "IPv4", false},
		{engineVariant{engine: EngineKernel}, "IPv6", false},
		{engineVariant{engine: EngineKernel}, "IPv4", true},
		{engineVariant{engine: EngineKernel, path: KernelPathEBPF}, "IPv4", false},
		{engineVariant{engine: EngineKernel, path: KernelPathEBPF}, "IPv4", true},
	} {
		name := c.v.String() + "/" + c.family
		if c.local {
			name += "/backend-on-the-LB-host"
		}
		t.Run(name, func(t *testing.T) { testServesAReusedPort(t, c.v, c.family, c.local) })
	}
}

func testServesAReusedPort(t *testing.T, v engineVariant, family string, local bool) {
	n := newEngineNetOn(t, v, family)
	a, aServer := n.echo(t, 8080)
	aHost := n.backendNS
	if local {
		ln, err := n.lb.Listen("tcp", netip.AddrPortFrom(n.ip.lbToBackend, 8080).String())
		if err != nil {
			t.Fatal(err)
		}
		aServer.close()
		aServer = serveEcho(t, ln)
		a, aHost = Backend{Address: n.ip.lbToBackend.String(), Port: 8080, Owner: "lb-host"}, n.lb
	}
	b, bServer := n.echo(t, 8081)
	n.apply(t, n.frontendOn(80, a))
	const port = 40123
	n.openThenEndUnseen(t, port, aHost, aServer)

	n.apply(t, n.frontendOn(80, a, b))
	if _, err := n.d.SetOwnerAdminState(a.Owner, AdminDown); err != nil {
		t.Fatal(err)
	}
	n.dialReusedPort(t, v, port)
	if v.path != KernelPathEBPF {
		if got := testutil.ToFloat64(n.d.m.kernelReused); got != 1 {
			t.Errorf("ebb_dataplane_kernel_reused_ports_total is %v, want 1", got)
		}
	}
	if got := bServer.accepted.Load(); got != 1 {
		t.Errorf("the eligible backend accepted %d connections, want the new one", got)
	}
}

// openThenEndUnseen opens a connection from the client's port to the
// frontend's port 80 (served by backend, on host), and ends it where the
// load balancer cannot see it: the client's reset is dropped on the
// client's host, and the backend forgets it (its reset dropped too) and
// stops listening.
func (n *engineNet) openThenEndUnseen(t *testing.T, port int, host *network.Host, backend *testBackend) {
	t.Helper()
	old, err := n.dialFromPort(port, 700*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(old, []byte("old")); err != nil {
		t.Fatal(err)
	}
	undropClient := n.dropSegmentsFrom(t, n.client, uint16(port))
	undropBackend := n.dropSegmentsFrom(t, host, uint16(backend.ln.Addr().(*net.TCPAddr).Port))
	_ = old.(*net.TCPConn).SetLinger(0)
	_ = old.Close()
	backend.mu.Lock()
	for _, c := range backend.conns {
		_ = c.(*net.TCPConn).SetLinger(0)
	}
	backend.mu.Unlock()
	backend.close()
	undropClient()
	undropBackend()
}

// dialReusedPort dials the frontend's port 80 from the client's port
// again, and sends a round trip on the connection. The eBPF path serves
// the first SYN; the nftables path the client's first retransmission.
func (n *engineNet) dialReusedPort(t *testing.T, v engineVariant, port int) {
	t.Helper()
	timeout := 700 * time.Millisecond
	if v.path != KernelPathEBPF {
		timeout = 2500 * time.Millisecond
	}
	start := time.Now()
	c, err := n.dialFromPort(port, timeout)
	if err != nil {
		t.Fatalf("a new connection from the reused port: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	t.Logf("connected from the reused port in %v", time.Since(start).Round(time.Millisecond))
	if err := roundTrip(c, []byte("new")); err != nil {
		t.Fatalf("a new connection from the reused port: %v", err)
	}
}

// dialFromPort dials the frontend's port 80 from the client's port.
func (n *engineNet) dialFromPort(port int, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := n.client.Do(func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: n.ip.client.AsSlice(), Port: port}}
		c, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(n.ip.frontend, 80).String())
		return err
	})
	return c, err
}

// dropSegmentsFrom drops the TCP segments host sends from port until the
// returned function is called.
func (n *engineNet) dropSegmentsFrom(t *testing.T, host *network.Host, port uint16) func() {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(host.NetNS()))
	if err != nil {
		t.Fatal(err)
	}
	table := c.AddTable(&nftables.Table{Name: "drop", Family: nftables.TableFamilyINet})
	ch := c.AddChain(&nftables.Chain{Name: "output", Table: table, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter})
	c.AddRule(&nftables.Rule{Table: table, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	if err := c.Flush(); err != nil {
		t.Fatalf("dropping the client's segments: %v", err)
	}
	return func() {
		c.DelTable(table)
		if err := c.Flush(); err != nil {
			t.Fatalf("no longer dropping the client's segments: %v", err)
		}
	}
}

// A client port used again, whose old connection went to the LB host's own
// node port, is served by the pod kube-proxy sends the node port to now,
// though the host's conntrack still holds the old connection translated to
// a pod that is gone. (The eBPF path once delivered the new connection with
// the client's port, so the host's stack took it to the old pod: refused.)
func TestKernelPathsServeAReusedPortWhoseOldPodIsGone(t *testing.T) {
	for _, v := range []engineVariant{{engine: EngineKernel}, {engine: EngineKernel, path: KernelPathEBPF}} {
		t.Run(v.String(), func(t *testing.T) {
			n := newEngineNetOn(t, v, "IPv4")
			_, oldPod := n.echo(t, 8081)
			nodePort := netip.AddrPortFrom(n.ip.lbToBackend, 30080)
			n.serveNodePort(t, nodePort, netip.AddrPortFrom(n.ip.backend, 8081))
			n.apply(t, n.frontendOn(80, Backend{Address: nodePort.Addr().String(), Port: nodePort.Port(), Owner: "lb-host"}))
			const port = 40124
			// The old connection ends unseen, and its pod goes; kube-proxy
			// sends the node port to another pod.
			n.openThenEndUnseen(t, port, n.backendNS, oldPod)
			_, newPod := n.echo(t, 8082)
			n.stopNodePort(t, nodePort.Addr())
			n.serveNodePort(t, nodePort, netip.AddrPortFrom(n.ip.backend, 8082))

			n.dialReusedPort(t, v, port)
			if got := newPod.accepted.Load(); got != 1 {
				t.Errorf("the node port's pod accepted %d connections, want the new one", got)
			}
		})
	}
}
