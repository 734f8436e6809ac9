package l2

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"
)

func addrs(n int) []netip.Addr {
	var out []netip.Addr
	for i := range n {
		if i%2 == 0 {
			out = append(out, netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}))
		} else {
			out = append(out, netip.MustParseAddr(fmt.Sprintf("fd00:96::%x", i)))
		}
	}
	return out
}

func TestHeartbeatRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 2, 80, 81, 500} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			want := addrs(n)
			frames := heartbeats("ebb.dev/l4", "node-1", 1, 7, want, nil)
			var got []netip.Addr
			for i, f := range frames {
				if len(f) > maxPayload {
					t.Fatalf("frame %d is %d bytes, more than an Ethernet payload", i, len(f))
				}
				h, err := parseHeartbeat(f)
				if err != nil {
					t.Fatal(err)
				}
				if h.Group != "ebb.dev/l4" || h.Node != "node-1" || h.Gen != 7 || int(h.Part) != i || int(h.Parts) != len(frames) {
					t.Fatalf("frame %d: %+v", i, h)
				}
				got = append(got, h.Addrs...)
			}
			if len(got) != len(want) || (n > 0 && !reflect.DeepEqual(got, want)) {
				t.Fatalf("got %d addresses back, want %d", len(got), len(want))
			}
		})
	}
}

func TestParseHeartbeatRefusesOtherFrames(t *testing.T) {
	good := heartbeats("g", "n", 1, 1, addrs(3), nil)[0]
	for name, b := range map[string][]byte{
		"empty":     nil,
		"not ours":  []byte("hello, world"),
		"truncated": good[:len(good)-3],
		"version":   append(append([]byte{}, good[:4]...), append([]byte{9}, good[5:]...)...),
		"no node":   heartbeat{Group: "g", Parts: 1}.marshal(),
		"bad part":  heartbeat{Group: "g", Node: "n", Part: 2, Parts: 2}.marshal(),
	} {
		if _, err := parseHeartbeat(b); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func FuzzParseHeartbeat(f *testing.F) {
	for _, fr := range heartbeats("ebb.dev/l4", "node-1", 1, 1, addrs(5), nil) {
		f.Add(fr)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHeartbeat(b)
		if err != nil {
			return
		}
		// What parses marshals back to a frame that parses the same.
		again, err := parseHeartbeat(h.marshal())
		if err != nil || !reflect.DeepEqual(again, h) {
			t.Fatalf("%+v parsed, re-marshalled to %+v, %v", h, again, err)
		}
	})
}

func TestMembers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m := newMembers(500 * time.Millisecond)
	big := addrs(200)
	frames := heartbeats("g", "b", 1, 1, big, nil)
	if len(frames) < 2 {
		t.Fatal("want a multi-part offer")
	}
	// Part 0 of a first offer: alive, offering nothing yet.
	h0, _ := parseHeartbeat(frames[0])
	m.observe(t0, h0)
	if live := m.live(t0); len(live) != 0 {
		t.Fatalf("an incomplete first offer counted: %v", live)
	}
	for _, f := range frames[1:] {
		h, _ := parseHeartbeat(f)
		m.observe(t0, h)
	}
	if got := m.live(t0)["b"]; len(got) != len(big) {
		t.Fatalf("offer of %d addresses, want %d", len(got), len(big))
	}
	// A new generation replaces the offer only once complete.
	small, _ := parseHeartbeat(heartbeats("g", "b", 1, 2, addrs(1), nil)[0])
	m.observe(t0.Add(100*time.Millisecond), small)
	if got := m.live(t0.Add(100 * time.Millisecond))["b"]; len(got) != 1 {
		t.Fatalf("offer of %d addresses after the new generation, want 1", len(got))
	}
	// An empty offer is an offer: alive, owning nothing.
	none, _ := parseHeartbeat(heartbeats("g", "b", 1, 3, nil, nil)[0])
	m.observe(t0.Add(200*time.Millisecond), none)
	if got, ok := m.live(t0.Add(200 * time.Millisecond))["b"]; !ok || len(got) != 0 {
		t.Fatalf("empty offer: %v, %v", got, ok)
	}
	// Silent past deadAfter: gone.
	if live := m.live(t0.Add(701 * time.Millisecond)); len(live) != 0 {
		t.Fatalf("a silent peer is still live: %v", live)
	}
}

// A peer that stops owning an address is noted once, so that the new
// owner announces it again; owned flags survive the frames.
func TestMembersNoteReleasedAddresses(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m := newMembers(time.Second)
	a, b := netip.MustParseAddr("10.96.240.1"), netip.MustParseAddr("10.96.240.2")
	observe := func(gen uint32, owned map[netip.Addr]bool) {
		t.Helper()
		for _, f := range heartbeats("g", "peer", 1, gen, []netip.Addr{a, b}, owned) {
			h, err := parseHeartbeat(f)
			if err != nil {
				t.Fatal(err)
			}
			m.observe(t0, h)
		}
	}
	observe(1, map[netip.Addr]bool{a: true, b: true})
	if r := m.takeReleased(); len(r) != 0 {
		t.Fatalf("released %v before anything was let go", r)
	}
	observe(2, map[netip.Addr]bool{a: true})
	if r := m.takeReleased(); len(r) != 1 || !r[b] {
		t.Fatalf("released %v, want only %s", r, b)
	}
	if r := m.takeReleased(); len(r) != 0 {
		t.Fatalf("released %v noted twice", r)
	}
	// A new process of the peer speaks for it, whatever its counts: what
	// the old one owned is released; the old one is then ignored.
	for _, f := range heartbeats("g", "peer", 2, 1, []netip.Addr{b}, nil) {
		h, _ := parseHeartbeat(f)
		m.observe(t0, h)
	}
	if r := m.takeReleased(); len(r) != 1 || !r[a] {
		t.Fatalf("released %v when a new process took over, want %s", r, a)
	}
	for _, f := range heartbeats("g", "peer", 1, 3, []netip.Addr{a, b}, map[netip.Addr]bool{a: true}) {
		h, _ := parseHeartbeat(f)
		m.observe(t0, h)
	}
	if got := m.live(t0)["peer"]; len(got) != 1 || got[0] != b {
		t.Fatalf("the old process's heartbeat changed the peer's offer to %v", got)
	}
	// A peer that falls silent releases what it owned.
	for _, f := range heartbeats("g", "peer", 2, 2, []netip.Addr{b}, map[netip.Addr]bool{b: true}) {
		h, _ := parseHeartbeat(f)
		m.observe(t0, h)
	}
	m.takeReleased()
	m.live(t0.Add(2 * time.Second))
	if r := m.takeReleased(); len(r) != 1 || !r[b] {
		t.Fatalf("released %v when the peer fell silent, want %s", r, b)
	}
}
