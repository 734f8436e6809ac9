package dataplane

import (
	"net/netip"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/google/nftables"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

func TestParseTCPTuple(t *testing.T) {
	v4 := []byte{
		0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 6, 0, 0, // IPv4, 20-byte header, TCP
		10, 2, 0, 2, // source
		10, 9, 0, 1, // destination
		0x9c, 0x7b, 0, 80, // ports 40059 -> 80
	}
	v4Options := append(append([]byte{0x46}, v4[1:20]...), append([]byte{1, 1, 1, 1}, v4[20:]...)...)
	v6 := make([]byte, 44)
	v6[0], v6[6] = 0x60, 6
	src, dst := netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd09::1")
	copy(v6[8:24], src.AsSlice())
	copy(v6[24:40], dst.AsSlice())
	copy(v6[40:], []byte{0x9c, 0x7b, 0x1f, 0x90})
	udp := append([]byte{}, v4...)
	udp[9] = 17
	for _, c := range []struct {
		name   string
		packet []byte
		want   reusedTuple
		ok     bool
	}{
		{"IPv4", v4, reusedTuple{netip.MustParseAddrPort("10.2.0.2:40059"), netip.MustParseAddrPort("10.9.0.1:80")}, true},
		{"IPv4 with options", v4Options, reusedTuple{netip.MustParseAddrPort("10.2.0.2:40059"), netip.MustParseAddrPort("10.9.0.1:80")}, true},
		{"IPv6", v6, reusedTuple{netip.AddrPortFrom(src, 40059), netip.AddrPortFrom(dst, 8080)}, true},
		{"not TCP", udp, reusedTuple{}, false},
		{"cut short", v4[:22], reusedTuple{}, false},
		{"IPv6 cut short", v6[:42], reusedTuple{}, false},
		{"empty", nil, reusedTuple{}, false},
		{"not IP", []byte{0x20, 0, 0, 0}, reusedTuple{}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := parseTCPTuple(c.packet)
			if ok != c.ok || got != c.want {
				t.Errorf("parseTCPTuple = %v, %v; want %v, %v", got, ok, c.want, c.ok)
			}
		})
	}
}

// One process in a network namespace reads the reused ports' SYNs: a new
// ebb lb (a hand-off) waits for the old one to let go of the group, and
// reads them from then on.
func TestReusedPortsReaderTakesOverTheGroup(t *testing.T) {
	host, err := network.NewHost("reused")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(host.Close)
	ns := host.NetNS()
	old := &reusedPorts{netns: ns, log: testr.New(t), retry: 20 * time.Millisecond}
	old.start(func() {})
	waitBound(t, old)
	next := &reusedPorts{netns: ns, log: testr.New(t), retry: 20 * time.Millisecond}
	next.start(func() {})
	defer next.close()
	time.Sleep(100 * time.Millisecond)
	if bound(next) {
		t.Fatal("a second reader bound the group the first holds")
	}
	old.close()
	waitBound(t, next)
}

func bound(p *reusedPorts) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn != nil
}

func waitBound(t *testing.T, p *reusedPorts) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for !bound(p) {
		if time.Now().After(deadline) {
			t.Fatal("the reader did not bind the nflog group")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The engine asks the kernel once whether it takes the reused-port rule
// (a kernel without nflog refuses it, and with it the whole table), and
// the question leaves no table behind.
func TestProbeNflogLeavesNothing(t *testing.T) {
	host, err := network.NewHost("probe")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(host.Close)
	if err := probeNflog(host.NetNS()); err != nil {
		t.Fatalf("this kernel has nflog, yet: %v", err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(host.NetNS()))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 0 {
		t.Errorf("the probe left %d tables, want none", len(tables))
	}
}
