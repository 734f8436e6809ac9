package flowfwd

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

var (
	vip     = netip.MustParseAddr("10.99.0.1")
	vipPort = netip.AddrPortFrom(vip, 8080)
	pfx     = netip.MustParsePrefix
	addr    = netip.MustParseAddr
)

// testNet: a client linked to two LB hosts, serving (10.1.0.0/24) and
// draining (10.2.0.0/24), which are linked to each other (10.3.0.0/24);
// the address is local on both, and the client routes it to either.
type testNet struct {
	client, serving, draining *network.Host
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
	}{{"ff-client", &n.client}, {"ff-serving", &n.serving}, {"ff-draining", &n.draining}} {
		host, err := network.NewHost(h.name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(host.Close)
		*h.to = host
	}
	for _, err := range []error{
		network.LinkHosts(n.client, "eth-s", []netip.Prefix{pfx("10.1.0.1/24")}, n.serving, "eth-c", []netip.Prefix{pfx("10.1.0.2/24")}),
		network.LinkHosts(n.client, "eth-d", []netip.Prefix{pfx("10.2.0.1/24")}, n.draining, "eth-c", []netip.Prefix{pfx("10.2.0.2/24")}),
		network.LinkHosts(n.serving, "eth-d", []netip.Prefix{pfx("10.3.0.1/24")}, n.draining, "eth-s", []netip.Prefix{pfx("10.3.0.2/24")}),
		n.serving.AddAddress("lo", netip.PrefixFrom(vip, 32)),
		n.draining.AddAddress("lo", netip.PrefixFrom(vip, 32)),
		n.client.AddRoute(netip.PrefixFrom(vip, 32), addr("10.2.0.2")),
		// Each host reaches both of the client's addresses, as through a
		// router: a reset the serving host sends reaches the client.
		n.serving.AddRoute(pfx("10.2.0.0/24"), addr("10.1.0.1")),
		n.draining.AddRoute(pfx("10.1.0.0/24"), addr("10.2.0.1")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// echo serves an echo on the address on h.
func echo(t *testing.T, h *network.Host) {
	t.Helper()
	ln, err := h.Listen("tcp", vipPort.String())
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

// moveTo makes the client's route to the address go through the host at
// via, as a router's ECMP does when a next hop goes away.
func (n *testNet) moveTo(t *testing.T, via string) {
	t.Helper()
	if err := n.client.DeleteRoute(netip.PrefixFrom(vip, 32)); err != nil {
		t.Fatal(err)
	}
	if err := n.client.AddRoute(netip.PrefixFrom(vip, 32), addr(via)); err != nil {
		t.Fatal(err)
	}
}

func roundTrip(c net.Conn, msg string) error {
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return err
}

func (n *testNet) connect(t *testing.T) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := n.client.DialContext(ctx, "tcp", vipPort.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := roundTrip(c, "before"); err != nil {
		t.Fatal(err)
	}
	return c
}

// A connection established through the draining host, moved by the route
// to the serving host: the serving host resets it without a forwarder
// (what every LB host does today), keeps it going with one that knows the
// draining peer, and a draining host's forwarder drops the segment rather
// than resetting it. The serving host's own connection never moves.
func TestMovedConnections(t *testing.T) {
	for _, tc := range []struct {
		name  string
		state *State // nil: no forwarder
		want  string // "ok", "reset" or "timeout"
		// ignored: the rules leave the segment alone (not counted).
		ignored bool
	}{
		{"without a forwarder the serving host resets it", nil, "reset", false},
		{"no draining peer: passed, reset", &State{Frontends: []netip.AddrPort{vipPort}}, "reset", false},
		{"to a port that is no frontend's: passed, reset", &State{Frontends: []netip.AddrPort{netip.AddrPortFrom(vip, 9999)}, Peers: []netip.Addr{addr("10.3.0.2")}}, "reset", true},
		{"forwarded to the draining peer", &State{Frontends: []netip.AddrPort{vipPort}, Peers: []netip.Addr{addr("10.3.0.2")}}, "ok", false},
		{"a draining host drops it", &State{Frontends: []netip.AddrPort{vipPort}, Draining: true}, "timeout", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNet(t)
			echo(t, n.draining)
			echo(t, n.serving)
			var f *Forwarder
			if tc.state != nil {
				f = New("", n.serving.NetNS())
				if err := f.Sync(*tc.state); err != nil {
					t.Fatal(err)
				}
			}
			// The serving host's own connection, established through it.
			n.moveTo(t, "10.1.0.2")
			own := n.connect(t)
			// One through the draining host, then moved.
			n.moveTo(t, "10.2.0.2")
			moved := n.connect(t)
			n.moveTo(t, "10.1.0.2")

			err := roundTrip(moved, "after the move")
			var got string
			var ne net.Error
			switch {
			case err == nil:
				got = "ok"
			case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
				got = "reset"
			case errors.As(err, &ne) && ne.Timeout():
				got = "timeout"
			default:
				got = err.Error()
			}
			if got != tc.want {
				t.Fatalf("the moved connection: %s, want %s", got, tc.want)
			}
			if err := roundTrip(own, "own"); err != nil {
				t.Fatalf("the serving host's own connection broke: %v", err)
			}
			if f != nil {
				segs, mode, err := f.Segments()
				if err != nil {
					t.Fatal(err)
				}
				if (segs == 0) != tc.ignored || mode != tc.state.mode() {
					t.Errorf("Segments() = %d, %s; want %s, %s", segs, mode, map[bool]string{true: "none", false: "some"}[tc.ignored], tc.state.mode())
				}
				// An operator can read the table with the nft tool.
				var out []byte
				err = n.serving.Do(func() (err error) {
					out, err = exec.Command("nft", "list", "ruleset").CombinedOutput()
					return err
				})
				if err != nil || !strings.Contains(string(out), "@frontends") {
					t.Errorf("nft list ruleset: %v\n%s\nwant the rule's lookup in @frontends", err, out)
				}
				if err := f.Remove(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// Two LB hosts that forward to each other at once (one joining while the
// other still counts it draining) would bounce a segment neither knows
// between them. A forwarded segment carries a mark (DSCP 7) and is never
// forwarded again: each transmission is forwarded once, then dropped.
// (Before 2026-11-27 it went back and forth until its TTL ran out, about
// 64 copies of every segment; earlier still, for as long as the two
// disagreed, since nf_dup's decrement took a TTL of 0 round to 255.)
func TestForwardingBetweenTwoHostsEnds(t *testing.T) {
	n := newTestNet(t)
	echo(t, n.serving)
	// Established before conntrack runs on either host (no rule has
	// turned it on yet), the connection is foreign to both.
	n.moveTo(t, "10.1.0.2")
	c := n.connect(t)
	fwds := map[string]*Forwarder{"serving": New("", n.serving.NetNS()), "draining": New("", n.draining.NetNS())}
	for name, peer := range map[string]string{"serving": "10.3.0.2", "draining": "10.3.0.1"} {
		if err := fwds[name].Sync(State{Frontends: []netip.AddrPort{vipPort}, Peers: []netip.Addr{addr(peer)}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = fwds[name].Remove() })
	}
	// Neither host knows the connection: the round trip cannot succeed.
	_ = roundTrip(c, "bounced")
	time.Sleep(500 * time.Millisecond)
	var total uint64
	for name, f := range fwds {
		segs, _, err := f.Segments()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s forwarded %d segments", name, segs)
		total += segs
	}
	// A handful of transmissions (the first, retransmissions and tail
	// loss probes over 1.5 s: about 4 to 10), each seen by both hosts
	// once; bouncing, each transmission was seen some 64 times.
	if total == 0 || total > 30 {
		t.Errorf("the two hosts saw %d foreign segments between them; want some, and each transmission only once on each host", total)
	}
}

// A host that gets a segment another host forwarded, of a connection it
// does not have either, drops it rather than resetting it: a third host it
// was also sent to may have the connection (the joining direction with
// more than two LB hosts). Before 2026-11-27 it answered with a reset,
// which ended the connection wherever it lived.
func TestAForwardedSegmentIsNeverReset(t *testing.T) {
	n := newTestNet(t)
	echo(t, n.serving)
	// Established before conntrack runs on either host: foreign to both.
	n.moveTo(t, "10.1.0.2")
	c := n.connect(t)
	forwarding, passing := New("", n.serving.NetNS()), New("", n.draining.NetNS())
	t.Cleanup(func() { _ = forwarding.Remove(); _ = passing.Remove() })
	if err := forwarding.Sync(State{Frontends: []netip.AddrPort{vipPort}, Peers: []netip.Addr{addr("10.3.0.2")}}); err != nil {
		t.Fatal(err)
	}
	if err := passing.Sync(State{Frontends: []netip.AddrPort{vipPort}}); err != nil {
		t.Fatal(err)
	}
	err := roundTrip(c, "forwarded")
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("the segment forwarded to a host without its connection: %v, want a timeout (dropped, not reset)", err)
	}
	if segs, _, err := passing.Segments(); err != nil || segs == 0 {
		t.Errorf("the passing host counted %d foreign segments (%v), want the forwarded ones", segs, err)
	}
}

// A firewall reload that flushes the ruleset, or a rule or the frontends
// emptied by hand, is repaired: moved connections are forwarded again. An
// intact table is left alone.
func TestRepairRestoresAFlushedTable(t *testing.T) {
	n := newTestNet(t)
	f := New("", n.serving.NetNS())
	t.Cleanup(func() { _ = f.Remove() })
	if err := f.Sync(State{Frontends: []netip.AddrPort{vipPort}, Peers: []netip.Addr{addr("10.3.0.2")}}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"flush", "ruleset"},
		{"flush", "set", "ip", DefaultTable, "frontends"},
		{"flush", "chain", "ip", DefaultTable, "prerouting"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			if repaired, err := f.Repair(); err != nil || repaired {
				t.Fatalf("Repair() of an intact table = %v, %v; want false, nil", repaired, err)
			}
			if err := n.serving.Do(func() error { return exec.Command("nft", args...).Run() }); err != nil {
				t.Fatal(err)
			}
			if repaired, err := f.Repair(); err != nil || !repaired {
				t.Fatalf("Repair() = %v, %v; want true, nil", repaired, err)
			}
			echo(t, n.draining)
			n.moveTo(t, "10.2.0.2")
			c := n.connect(t)
			n.moveTo(t, "10.1.0.2")
			if err := roundTrip(c, "moved"); err != nil {
				t.Errorf("a moved connection after the repair: %v", err)
			}
		})
	}
}
