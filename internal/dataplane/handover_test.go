package dataplane

import (
	"net"
	"strings"
	"testing"
)

// A successor serves on its predecessor's sockets: it opens none (a port
// held by the predecessor would fail), new connections reach it once the
// predecessor hands over, the predecessor's established connection goes on,
// and a socket no frontend of the successor wants closes for good.
func TestHandOverTCP(t *testing.T) {
	b := newTestBackend(t)
	web, gone := freeAddr(t, "tcp"), freeAddr(t, "tcp")
	old := newDataPlane(t, Options{})
	mustApply(t, old, tcpFrontend("web", web, b.backend()), tcpFrontend("gone", gone, b.backend()))
	established, err := net.Dial("tcp", web.String())
	if err != nil {
		t.Fatal(err)
	}
	defer established.Close()
	if err := roundTrip(established, []byte("before")); err != nil {
		t.Fatal(err)
	}

	sockets, err := old.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	if len(sockets) != 2 {
		t.Fatalf("%d sockets, want 2", len(sockets))
	}
	successor := newDataPlane(t, Options{Inherited: sockets})
	res, err := successor.Apply(Config{Frontends: []Frontend{tcpFrontend("web", web, b.backend())}})
	if err != nil || len(res.Skipped) > 0 {
		t.Fatalf("the successor could not serve on the handed-over socket: %v %v", err, res.Err())
	}
	if n := successor.ReleaseInherited(); n != 1 {
		t.Fatalf("released %d unused sockets, want 1 (gone's)", n)
	}
	old.HandOver()

	if _, err := old.Apply(Config{}); err == nil {
		t.Error("the predecessor applied a configuration after handing over")
	}
	fresh, err := net.Dial("tcp", web.String())
	if err != nil {
		t.Fatalf("a new connection after the hand-over: %v", err)
	}
	defer fresh.Close()
	if err := roundTrip(fresh, []byte("after")); err != nil {
		t.Fatal(err)
	}
	if got := successor.Connections(); got != 1 {
		t.Errorf("successor has %d connections, want the new one", got)
	}
	if err := roundTrip(established, []byte("still")); err != nil {
		t.Fatalf("the predecessor's established connection broke: %v", err)
	}
	if got := old.Connections(); got != 1 {
		t.Errorf("predecessor has %d connections, want its established one", got)
	}
	if c, err := net.Dial("tcp", gone.String()); err == nil {
		c.Close()
		t.Error("the socket of a frontend nobody serves still accepts")
	}
}

// UDP: after the hand-over the successor reads the socket, so a client's
// next datagram is answered through it.
func TestHandOverUDP(t *testing.T) {
	x := udpBackend(t, "x")
	at := freeAddr(t, "udp")
	fe := Frontend{Name: "dns", Address: at.Addr().String(), Port: at.Port(), Protocol: UDP, Backends: []Backend{x}}
	old := newDataPlane(t, Options{})
	mustApply(t, old, fe)
	c, err := net.Dial("udp", at.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := udpAsk(t, c, "one"); got != "x:one" {
		t.Fatalf("answer %q", got)
	}
	sockets, err := old.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	successor := newDataPlane(t, Options{Inherited: sockets})
	mustApply(t, successor, fe)
	old.HandOver()
	if got := udpAsk(t, c, "two"); !strings.HasSuffix(got, "two") {
		t.Fatalf("answer %q after the hand-over", got)
	}
	waitFor(t, "the successor to carry the flow", func() bool {
		_ = udpAsk(t, c, "three")
		for _, s := range successor.Status() {
			if s.Active > 0 {
				return true
			}
		}
		return false
	})
}
