package dataplane

import (
	"net"
	"strings"
	"testing"
	"time"
)

// udpBackend answers every datagram with "name:" + the datagram.
func udpBackend(t *testing.T, name string) Backend {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(append([]byte(name+":"), buf[:n]...), from)
		}
	}()
	ap := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	return Backend{Address: ap.Addr().String(), Port: ap.Port(), Owner: name}
}

func udpAsk(t *testing.T, c net.Conn, msg string) string {
	t.Helper()
	buf := make([]byte, 2048)
	for range 20 {
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := c.Read(buf)
		if err == nil {
			return string(buf[:n])
		}
	}
	t.Fatalf("no UDP answer to %q", msg)
	return ""
}

// A UDP flow stays on its backend, and moves to another one when its
// backend is set admin Down.
func TestUDPFlowPinningAndMigrationOnDown(t *testing.T) {
	x, y := udpBackend(t, "x"), udpBackend(t, "y")
	d := newDataPlane(t, Options{})
	at := freeAddr(t, "udp")
	fe := Frontend{Name: "dns", Address: at.Addr().String(), Port: at.Port(), Protocol: UDP, Backends: []Backend{x, y}}
	mustApply(t, d, fe)
	c, err := net.Dial("udp", at.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	first := strings.SplitN(udpAsk(t, c, "one"), ":", 2)[0]
	for i := range 10 {
		if got := strings.SplitN(udpAsk(t, c, "again"), ":", 2)[0]; got != first {
			t.Fatalf("datagram %d of the flow went to %s, the flow is pinned to %s", i, got, first)
		}
	}
	for i := range fe.Backends {
		if fe.Backends[i].Owner == first {
			fe.Backends[i].AdminState = AdminDown
		}
	}
	mustApply(t, d, fe)
	if got := strings.SplitN(udpAsk(t, c, "after down"), ":", 2)[0]; got == first {
		t.Fatalf("the flow stayed on %s after it was set Down", got)
	}
	if got := udpAsk(t, c, "payload"); !strings.HasSuffix(got, ":payload") {
		t.Errorf("answer %q is not the echo", got)
	}
}

// A UDP frontend without an eligible backend drops datagrams (there is no
// connection to refuse) and counts them.
func TestUDPWithoutBackendsDrops(t *testing.T) {
	d := newDataPlane(t, Options{})
	at := freeAddr(t, "udp")
	x := udpBackend(t, "x")
	x.AdminState = AdminDown
	mustApply(t, d, Frontend{Name: "dns", Address: at.Addr().String(), Port: at.Port(), Protocol: UDP, Backends: []Backend{x}})
	c, err := net.Dial("udp", at.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("anyone?"))
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := c.Read(make([]byte, 64)); err == nil {
		t.Fatalf("got an answer (%d bytes) with every backend Down", n)
	}
}
