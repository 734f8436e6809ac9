package dataplane

import (
	"fmt"
	"net/netip"
	"testing"
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
