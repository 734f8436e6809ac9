package l2

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
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

// testKeys is one key, "k1".
func testKeys(t testing.TB) *Keys {
	t.Helper()
	k, err := ParseKeys(map[string][]byte{"k1": []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// sender numbers one test replica's frames, as an Announcer does.
type sender struct {
	keys *Keys
	seq  uint64
}

func (s *sender) frames(group, node string, incarnation uint64, gen uint32, addrs []netip.Addr, owned map[netip.Addr]bool) [][]byte {
	return heartbeats(s.keys, group, node, incarnation, &s.seq, gen, addrs, owned)
}

// observeAll parses and observes every frame, failing on a refusal.
func observeAll(t *testing.T, m *members, now time.Time, frames [][]byte, keys *Keys) {
	t.Helper()
	for _, f := range frames {
		h, err := parseHeartbeat(f, keys)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.observe(now, h); err != nil {
			t.Fatal(err)
		}
	}
}

func TestHeartbeatRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 2, 80, 81, 500} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			want := addrs(n)
			keys := testKeys(t)
			frames := (&sender{keys: keys}).frames("ebb.dev/l4", "node-1", 1, 7, want, nil)
			var got []netip.Addr
			for i, f := range frames {
				if len(f) > maxPayload {
					t.Fatalf("frame %d is %d bytes, more than an Ethernet payload", i, len(f))
				}
				h, err := parseHeartbeat(f, keys)
				if err != nil {
					t.Fatal(err)
				}
				if h.Group != "ebb.dev/l4" || h.Node != "node-1" || h.Gen != 7 || int(h.Part) != i || int(h.Parts) != len(frames) || h.Seq != uint64(i+1) {
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
	keys := testKeys(t)
	other, err := ParseKeys(map[string][]byte{"k1": []byte("another key, same ID, 32 bytes..")})
	if err != nil {
		t.Fatal(err)
	}
	good := (&sender{keys: keys}).frames("g", "n", 1, 1, addrs(3), nil)[0]
	flipped := append([]byte{}, good...)
	flipped[len(flipped)-macLen-1] ^= 1 // an owned flag or address byte
	// What version 1 sent: no key ID, no seq, no MAC.
	v1 := append(append([]byte{}, heartbeatMagic[:]...), 1, 1, 'g', 1, 'n')
	v1 = append(v1, make([]byte, 8+4+2+2)...)
	for name, c := range map[string]struct {
		frame  []byte
		reason string
	}{
		"empty":             {nil, refusedMalformed},
		"not ours":          {[]byte("hello, world"), refusedMalformed},
		"truncated":         {good[:20], refusedMalformed},
		"version 1":         {v1, refusedUnsigned},
		"another key":       {(&sender{keys: other}).frames("g", "n", 1, 1, addrs(3), nil)[0], refusedUnsigned},
		"changed in flight": {flipped, refusedUnsigned},
		"MAC cut off":       {good[:len(good)-1], refusedUnsigned},
		"no node":           {heartbeat{Group: "g", Parts: 1}.marshal(keys), refusedMalformed},
		"bad part":          {heartbeat{Group: "g", Node: "n", Part: 2, Parts: 2}.marshal(keys), refusedMalformed},
	} {
		_, err := parseHeartbeat(c.frame, keys)
		if err == nil {
			t.Errorf("%s: parsed", name)
			continue
		}
		if got := refusedReason(err); got != c.reason {
			t.Errorf("%s: refused as %s (%v), want %s", name, got, err, c.reason)
		}
	}
	if _, err := parseHeartbeat(good, nil); refusedReason(err) != refusedUnsigned {
		t.Errorf("without keys: %v, want refused as unauthenticated", err)
	}
}

// Rotation: a frame signed with either key is accepted while both are
// there; the signing key is the one named.
func TestKeysRotate(t *testing.T) {
	old := []byte("old key: 32 bytes of randomness.")
	next := []byte("new key: 32 bytes of randomness.")
	both, err := ParseKeys(map[string][]byte{"old": old, "new": next, SigningKeyField: []byte("new\n")})
	if err != nil {
		t.Fatal(err)
	}
	onlyOld, err := ParseKeys(map[string][]byte{"old": old})
	if err != nil {
		t.Fatal(err)
	}
	if both.SigningID() != "new" || onlyOld.SigningID() != "old" {
		t.Fatalf("signing with %q and %q, want new and old", both.SigningID(), onlyOld.SigningID())
	}
	for _, c := range []struct {
		from, to *Keys
		ok       bool
	}{{onlyOld, both, true}, {both, both, true}, {both, onlyOld, false}} {
		f := (&sender{keys: c.from}).frames("g", "n", 1, 1, addrs(1), nil)[0]
		if _, err := parseHeartbeat(f, c.to); (err == nil) != c.ok {
			t.Errorf("signed with %s, checked with %v: %v", c.from.SigningID(), c.to.IDs(), err)
		}
	}
	for name, data := range map[string]map[string][]byte{
		"none":                {},
		"short":               {"k": []byte("short")},
		"two, none named":     {"a": old, "b": next},
		"signing key missing": {"a": old, SigningKeyField: []byte("b")},
	} {
		if _, err := ParseKeys(data); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzParseHeartbeat(f *testing.F) {
	keys := testKeys(f)
	for _, fr := range (&sender{keys: keys}).frames("ebb.dev/l4", "node-1", 1, 1, addrs(5), nil) {
		f.Add(fr[:len(fr)-macLen])
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// Signed after the mutation, so that the parser behind the
		// signature check is what is fuzzed.
		h, err := parseHeartbeat(keys.sign(slices.Clone(body)), keys)
		if err != nil {
			return
		}
		// What parses marshals back to a frame that parses the same.
		again, err := parseHeartbeat(h.marshal(keys), keys)
		if err != nil || !reflect.DeepEqual(again, h) {
			t.Fatalf("%+v parsed, re-marshalled to %+v, %v", h, again, err)
		}
	})
}

// A frame heard again is ignored; one far behind the latest is refused
// (a replay), and so are the frames of a peer that fell silent; one
// overtaken by a later frame (heard on another interface) is a sign of
// life that changes no offer; a new process's frames count afresh.
func TestMembersRefuseReplays(t *testing.T) {
	keys := testKeys(t)
	t0 := time.Unix(1000, 0)
	m := newMembers(time.Second)
	s := &sender{keys: keys}
	first := s.frames("g", "peer", 1, 1, addrs(1), nil)
	observeAll(t, m, t0, first, keys)
	var later [][]byte
	for gen := range uint32(seqWindow + 1) {
		later = s.frames("g", "peer", 1, 2+gen, addrs(2), nil)
		observeAll(t, m, t0, later, keys)
	}
	h, _ := parseHeartbeat(later[0], keys)
	if fresh, err := m.observe(t0, h); fresh || err != nil {
		t.Fatalf("the latest frame heard again (another interface): fresh %v, %v", fresh, err)
	}
	h, _ = parseHeartbeat(first[0], keys)
	if _, err := m.observe(t0, h); refusedReason(err) != refusedReplayed {
		t.Fatalf("a frame %d behind the latest: %v, want refused as replayed", seqWindow+1, err)
	}
	if got := m.live(t0)["peer"]; len(got) != 2 {
		t.Fatalf("the replay changed the offer to %v", got)
	}
	// Overtaken: gen 100 (one address) sent before gen 101 (three), heard
	// after it.
	overtaken := s.frames("g", "peer", 1, 100, addrs(1), nil)
	observeAll(t, m, t0, s.frames("g", "peer", 1, 101, addrs(3), nil), keys)
	h, _ = parseHeartbeat(overtaken[0], keys)
	if fresh, err := m.observe(t0.Add(900*time.Millisecond), h); !fresh || err != nil {
		t.Fatalf("an overtaken frame: fresh %v, %v; want a sign of life", fresh, err)
	}
	if got := m.live(t0.Add(1500 * time.Millisecond))["peer"]; len(got) != 3 {
		t.Fatalf("after the overtaken frame the offer is %v, want gen 101's 3 addresses (and alive)", got)
	}
	// Fallen silent: its frames replayed do not bring it back.
	m.live(t0.Add(5 * time.Second))
	if _, err := m.observe(t0.Add(5*time.Second), h); refusedReason(err) != refusedReplayed {
		t.Fatalf("a silent peer's frame replayed: %v, want refused as replayed", err)
	}
	if got := m.live(t0.Add(5 * time.Second)); len(got) != 0 {
		t.Fatalf("the silent peer is back: %v", got)
	}
	// Not for ever (a clock that went back gives a new process a lower
	// incarnation).
	if _, err := m.observe(t0.Add(5*time.Second+rememberGone), h); err != nil {
		t.Fatalf("after %s: %v", rememberGone, err)
	}
	m.live(t0.Add(10*time.Second + 2*rememberGone))
	// The same process, heard again with new frames (a cable plugged back),
	// or a new process: counted again.
	back := t0.Add(10*time.Second + 2*rememberGone)
	observeAll(t, m, back, s.frames("g", "peer", 1, 102, addrs(1), nil), keys)
	observeAll(t, m, back, (&sender{keys: keys}).frames("g", "peer", 2, 1, addrs(3), nil), keys)
	if got := m.live(back)["peer"]; len(got) != 3 {
		t.Fatalf("the new process's offer is %v, want 3 addresses", got)
	}
}

// Peers are bounded: one more is refused until a known one falls silent.
func TestMembersAreBounded(t *testing.T) {
	keys := testKeys(t)
	t0 := time.Unix(1000, 0)
	m := newMembers(time.Second)
	for i := range maxPeers {
		observeAll(t, m, t0, (&sender{keys: keys}).frames("g", fmt.Sprintf("peer-%d", i), 1, 1, nil, nil), keys)
	}
	h, _ := parseHeartbeat((&sender{keys: keys}).frames("g", "one-more", 1, 1, nil, nil)[0], keys)
	if _, err := m.observe(t0, h); refusedReason(err) != refusedTooManyPeers {
		t.Fatalf("peer %d: %v, want refused as too_many_peers", maxPeers+1, err)
	}
	// A known peer is still heard.
	observeAll(t, m, t0, (&sender{keys: keys, seq: 5}).frames("g", "peer-0", 1, 2, addrs(1), nil), keys)
	m.live(t0.Add(2 * time.Second)) // all fall silent
	if _, err := m.observe(t0.Add(2*time.Second), h); err != nil {
		t.Fatalf("once the others fell silent: %v", err)
	}
}

func TestMembers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m := newMembers(500 * time.Millisecond)
	keys := testKeys(t)
	b := &sender{keys: keys}
	big := addrs(200)
	frames := b.frames("g", "b", 1, 1, big, nil)
	if len(frames) < 2 {
		t.Fatal("want a multi-part offer")
	}
	// Part 0 of a first offer: alive, offering nothing yet.
	observeAll(t, m, t0, frames[:1], keys)
	if live := m.live(t0); len(live) != 0 {
		t.Fatalf("an incomplete first offer counted: %v", live)
	}
	observeAll(t, m, t0, frames[1:], keys)
	if got := m.live(t0)["b"]; len(got) != len(big) {
		t.Fatalf("offer of %d addresses, want %d", len(got), len(big))
	}
	// A new generation replaces the offer only once complete.
	observeAll(t, m, t0.Add(100*time.Millisecond), b.frames("g", "b", 1, 2, addrs(1), nil), keys)
	if got := m.live(t0.Add(100 * time.Millisecond))["b"]; len(got) != 1 {
		t.Fatalf("offer of %d addresses after the new generation, want 1", len(got))
	}
	// An empty offer is an offer: alive, owning nothing.
	observeAll(t, m, t0.Add(200*time.Millisecond), b.frames("g", "b", 1, 3, nil, nil), keys)
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
	keys := testKeys(t)
	first, second := &sender{keys: keys}, &sender{keys: keys}
	a, b := netip.MustParseAddr("10.96.240.1"), netip.MustParseAddr("10.96.240.2")
	observe := func(gen uint32, owned map[netip.Addr]bool) {
		t.Helper()
		observeAll(t, m, t0, first.frames("g", "peer", 1, gen, []netip.Addr{a, b}, owned), keys)
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
	observeAll(t, m, t0, second.frames("g", "peer", 2, 1, []netip.Addr{b}, nil), keys)
	if r := m.takeReleased(); len(r) != 1 || !r[a] {
		t.Fatalf("released %v when a new process took over, want %s", r, a)
	}
	observeAll(t, m, t0, first.frames("g", "peer", 1, 3, []netip.Addr{a, b}, map[netip.Addr]bool{a: true}), keys)
	if got := m.live(t0)["peer"]; len(got) != 1 || got[0] != b {
		t.Fatalf("the old process's heartbeat changed the peer's offer to %v", got)
	}
	// A peer that falls silent releases what it owned.
	observeAll(t, m, t0, second.frames("g", "peer", 2, 2, []netip.Addr{b}, map[netip.Addr]bool{b: true}), keys)
	m.takeReleased()
	m.live(t0.Add(2 * time.Second))
	if r := m.takeReleased(); len(r) != 1 || !r[b] {
		t.Fatalf("released %v when the peer fell silent, want %s", r, b)
	}
}
