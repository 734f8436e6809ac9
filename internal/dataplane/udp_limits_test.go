package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// udpFlows counts the frontend's UDP flows.
func udpFlows(d *DataPlane, at netip.AddrPort) int {
	d.mu.Lock()
	f := d.frontends[frontendKey{addr: at, protocol: UDP}]
	d.mu.Unlock()
	f.flowsMu.Lock()
	defer f.flowsMu.Unlock()
	return len(f.flows)
}

// sendFrom sends one datagram to at from each of n new sockets of the
// address from (each a new source port, as a scan or a flood cycles them),
// and counts the answers that come back within a short time. It sends in
// batches, so that no socket buffer overflows on the way.
func sendFrom(t *testing.T, from string, at netip.AddrPort, n int) (answered int) {
	t.Helper()
	const batch = 50
	for sent := 0; sent < n; sent += batch {
		conns := send(t, from, at, min(batch, n-sent))
		deadline := time.Now().Add(300 * time.Millisecond)
		buf := make([]byte, 64)
		for _, c := range conns {
			_ = c.SetReadDeadline(deadline)
			if _, err := c.Read(buf); err == nil {
				answered++
			}
		}
	}
	return answered
}

// send sends one datagram to at from each of n new sockets of the address
// from, and returns the sockets.
func send(t *testing.T, from string, at netip.AddrPort, n int) []*net.UDPConn {
	t.Helper()
	var conns []*net.UDPConn
	for range n {
		c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(from+":0")), net.UDPAddrFromAddrPort(at))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	return conns
}

// One client address cycling source ports gets a bounded number of UDP
// flows (before: one each, a goroutine and 64 KiB apiece, until ebb lb ran
// out of memory); another client is still served.
func TestUDPFlowsOfOneSourceAreBounded(t *testing.T) {
	d := newDataPlane(t, Options{})
	at := freeAddr(t, "udp")
	mustApply(t, d, Frontend{Name: "dns", Address: at.Addr().String(), Port: at.Port(), Protocol: UDP, Backends: []Backend{udpBackend(t, "x")}})
	answered := sendFrom(t, "127.0.0.1", at, 400)
	if got := udpFlows(d, at); got > 256 {
		t.Fatalf("one client address holds %d UDP flows, want at most 256", got)
	}
	if answered > 256 {
		t.Errorf("%d of one client address's 400 flows were answered, want at most 256", answered)
	}
	if got := sendFrom(t, "127.0.0.2", at, 1); got != 1 {
		t.Errorf("another client address got %d answers, want 1", got)
	}
}

// Each limit refuses the flows beyond it, and says so in the metric; the
// flows within it are answered.
func TestUDPFlowLimits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits UDPLimits
		// from: the client addresses, each sending from 10 source ports;
		// frontends: how many frontends (each gets every client).
		from      []string
		frontends int
		answered  int
		reason    string
	}{
		{"per source", UDPLimits{PerSource: 4}, []string{"127.0.0.1", "127.0.0.2"}, 1, 8, "udp_flows_source"},
		{"per frontend", UDPLimits{PerFrontend: 6}, []string{"127.0.0.1", "127.0.0.2"}, 1, 6, "udp_flows_frontend"},
		{"in total", UDPLimits{Total: 15}, []string{"127.0.0.1"}, 2, 15, "udp_flows_total"},
		{"within every limit", UDPLimits{}, []string{"127.0.0.1", "127.0.0.2"}, 2, 40, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			d := newDataPlane(t, Options{UDPFlows: tc.limits, Registerer: reg})
			var fes []Frontend
			for i := range tc.frontends {
				at := freeAddr(t, "udp")
				fes = append(fes, Frontend{Name: fmt.Sprintf("dns-%d", i), Address: at.Addr().String(), Port: at.Port(), Protocol: UDP, Backends: []Backend{udpBackend(t, "x")}})
			}
			mustApply(t, d, fes...)
			answered := 0
			for _, fe := range fes {
				for _, from := range tc.from {
					answered += sendFrom(t, from, netip.AddrPortFrom(netip.MustParseAddr(fe.Address), fe.Port), 10)
				}
			}
			if answered != tc.answered {
				t.Errorf("%d flows answered, want %d", answered, tc.answered)
			}
			refused := 0.0
			for _, fe := range fes {
				refused += testutil.ToFloat64(d.m.refused.WithLabelValues(fe.Name, orNone(tc.reason)))
			}
			if want := float64(10*len(tc.from)*tc.frontends - tc.answered); tc.reason != "" && refused != want {
				t.Errorf("ebb_dataplane_refused_total{reason=%q} = %v, want %v", tc.reason, refused, want)
			}
			if got := testutil.ToFloat64(d.m.udpFlows); got != float64(tc.answered) {
				t.Errorf("ebb_dataplane_udp_flows = %v, want %v", got, tc.answered)
			}
		})
	}
}

func orNone(reason string) string {
	if reason == "" {
		return "none"
	}
	return reason
}

// A flow its backend never answered ends after the short unanswered idle
// time, freeing its place; an answered one lasts the frontend's idle
// timeout.
func TestUnansweredUDPFlowsEndSooner(t *testing.T) {
	d := newDataPlane(t, Options{UDPFlows: UDPLimits{PerSource: 1}})
	d.udpUnansweredIdle = 200 * time.Millisecond
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	sp := silent.LocalAddr().(*net.UDPAddr).AddrPort()
	quiet := freeAddr(t, "udp")
	answering := freeAddr(t, "udp")
	mustApply(t, d,
		Frontend{Name: "quiet", Address: quiet.Addr().String(), Port: quiet.Port(), Protocol: UDP, Backends: []Backend{{Address: sp.Addr().String(), Port: sp.Port()}}},
		Frontend{Name: "answering", Address: answering.Addr().String(), Port: answering.Port(), Protocol: UDP, Backends: []Backend{udpBackend(t, "x")}})
	send(t, "127.0.0.1", quiet, 1)
	waitFor(t, "the unanswered flow", func() bool { return udpFlows(d, quiet) == 1 })
	if sendFrom(t, "127.0.0.1", answering, 1) != 1 {
		t.Fatal("the answering frontend did not answer")
	}
	waitFor(t, "the unanswered flow to end", func() bool { return udpFlows(d, quiet) == 0 })
	time.Sleep(300 * time.Millisecond)
	if got := udpFlows(d, answering); got != 1 {
		t.Errorf("the answered flow is gone after the unanswered idle time (%d flows), want it kept for the idle timeout", got)
	}
	// Its place is free again for the same client address.
	send(t, "127.0.0.1", quiet, 1)
	waitFor(t, "a new flow of the client address once the unanswered one ended", func() bool { return udpFlows(d, quiet) == 1 })
}

// An idle UDP flow costs a goroutine and a socket, not a 64 KiB buffer
// (before: about 67 KB of heap each, so 10,000 source ports within the
// idle timeout took 650 MB).
func TestIdleUDPFlowsCostLittleMemory(t *testing.T) {
	const flows = 2000
	d := newDataPlane(t, Options{UDPFlows: UDPLimits{PerSource: flows, PerFrontend: flows, Total: flows}})
	at := freeAddr(t, "udp")
	mustApply(t, d, Frontend{Name: "dns", Address: at.Addr().String(), Port: at.Port(), Protocol: UDP, Backends: []Backend{udpBackend(t, "x")}})
	before := memInUse()
	if got := sendFrom(t, "127.0.0.1", at, flows); got != flows {
		t.Fatalf("%d of %d flows answered", got, flows)
	}
	perFlow := (memInUse() - before) / flows
	t.Logf("%d bytes per idle UDP flow", perFlow)
	if perFlow > 16<<10 {
		t.Errorf("an idle UDP flow costs %d bytes of heap and stack, want at most 16 KiB", perFlow)
	}
}

func memInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}
