package l2

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// EtherType carries the replicas' heartbeats: IEEE 802's local experimental
// EtherType 1. Heartbeats are Ethernet broadcasts on the announcing
// interfaces, so they reach exactly the hosts that can take an address
// over (those on the same segment), with no IP address, port or peer list
// to configure.
const EtherType = 0x88B5

// heartbeatMagic starts every heartbeat, with its version.
var heartbeatMagic = [4]byte{'e', 'b', 'L', '2'}

// heartbeatVersion 2 is signed (keys.go); version 1 was not, and is
// refused.
const heartbeatVersion = 2

// maxPayload is what one heartbeat may carry: an Ethernet frame's payload.
const maxPayload = 1500

// heartbeat is one replica telling the others on the segment that it is
// alive and which addresses it offers to own. A set too large for one
// frame goes in several parts of one generation.
type heartbeat struct {
	// Group: replicas of one group share addresses (the load-balancer
	// class); heartbeats of other groups on the segment are ignored.
	Group string
	// Node names the replica's host: a hand-off's two processes on one
	// host are one member.
	Node string
	// Incarnation tells two processes of one node apart (when each
	// started, in Unix nanoseconds): the later one speaks for the node,
	// and its counts start afresh.
	Incarnation uint64
	// Seq counts the frames of one incarnation: a frame whose Seq is not
	// above the last one heard from it is a replay, and refused.
	Seq uint64
	// Gen changes whenever the offered set changes.
	Gen uint32
	// Part counts from 0 to Parts-1.
	Part, Parts uint8
	Addrs       []netip.Addr
	// Owned says, for each of Addrs, whether the replica owns it now.
	Owned []bool
}

// marshal returns the frame signed with keys' signing key.
func (h heartbeat) marshal(keys *Keys) []byte {
	id := keys.SigningID()
	b := append([]byte{}, heartbeatMagic[:]...)
	b = append(b, heartbeatVersion, byte(len(id)))
	b = append(b, id...)
	b = append(b, byte(len(h.Group)))
	b = append(b, h.Group...)
	b = append(b, byte(len(h.Node)))
	b = append(b, h.Node...)
	b = binary.BigEndian.AppendUint64(b, h.Incarnation)
	b = binary.BigEndian.AppendUint64(b, h.Seq)
	b = binary.BigEndian.AppendUint32(b, h.Gen)
	b = append(b, h.Part, h.Parts)
	b = binary.BigEndian.AppendUint16(b, uint16(len(h.Addrs)))
	for i, a := range h.Addrs {
		family := byte(6)
		if a.Is4() {
			family = 4
		}
		if i < len(h.Owned) && h.Owned[i] {
			family |= ownedBit
		}
		b = append(b, family)
		b = append(b, a.AsSlice()...)
	}
	return keys.sign(b)
}

// ownedBit marks an owned address in its family byte.
const ownedBit = 0x80

// Why a frame was refused (the reason label of
// ebb_lb_l2_heartbeats_refused_total).
const (
	refusedMalformed    = "malformed"
	refusedUnsigned     = "unauthenticated"
	refusedReplayed     = "replayed"
	refusedTooManyPeers = "too_many_peers"
)

// refusedReasons are every reason a frame is refused for.
var refusedReasons = []string{refusedMalformed, refusedUnsigned, refusedReplayed, refusedTooManyPeers}

// newRefusedCounts returns a counter for each of refusedReasons.
func newRefusedCounts() map[string]*atomic.Uint64 {
	m := make(map[string]*atomic.Uint64, len(refusedReasons))
	for _, r := range refusedReasons {
		m[r] = new(atomic.Uint64)
	}
	return m
}

// frameError is why a frame was refused.
type frameError struct {
	reason string
	err    error
}

func (e *frameError) Error() string { return e.err.Error() }

func refused(reason string, err error) error { return &frameError{reason: reason, err: err} }

// refusedReason is the reason label of err (malformed when it says none).
func refusedReason(err error) string {
	var fe *frameError
	if errors.As(err, &fe) {
		return fe.reason
	}
	return refusedMalformed
}

var errNotHeartbeat = errors.New("not an ebb L2 heartbeat")

// parseHeartbeat checks a frame's signature against keys, then reads it.
// Nothing of an unsigned frame is read past the key ID.
func parseHeartbeat(b []byte, keys *Keys) (heartbeat, error) {
	var h heartbeat
	if len(b) < 6 || [4]byte(b[:4]) != heartbeatMagic {
		return h, refused(refusedMalformed, errNotHeartbeat)
	}
	if b[4] != heartbeatVersion {
		return h, refused(refusedUnsigned, fmt.Errorf("heartbeat version %d, want %d (version 1 is not signed)", b[4], heartbeatVersion))
	}
	if len(b) < 6+int(b[5])+macLen {
		return h, refused(refusedMalformed, errors.New("heartbeat: truncated"))
	}
	id := string(b[6 : 6+int(b[5])])
	body, mac := b[:len(b)-macLen], b[len(b)-macLen:]
	if keys == nil || !keys.verify(id, body, mac) {
		return h, refused(refusedUnsigned, fmt.Errorf("heartbeat signed with key %q: no such key, or the signature does not match", id))
	}
	r := reader{b: body[6+len(id):]}
	h.Group = string(r.next(int(r.byte())))
	h.Node = string(r.next(int(r.byte())))
	h.Incarnation = binary.BigEndian.Uint64(r.next(8))
	h.Seq = binary.BigEndian.Uint64(r.next(8))
	h.Gen = binary.BigEndian.Uint32(r.next(4))
	h.Part, h.Parts = r.byte(), r.byte()
	n := int(binary.BigEndian.Uint16(r.next(2)))
	for range n {
		var a netip.Addr
		family := r.byte()
		switch family &^ ownedBit {
		case 4:
			a = netip.AddrFrom4([4]byte(r.next(4)))
		case 6:
			a = netip.AddrFrom16([16]byte(r.next(16)))
		default:
			r.err = errors.New("address of unknown family")
		}
		if r.err != nil {
			break
		}
		h.Addrs = append(h.Addrs, a)
		h.Owned = append(h.Owned, family&ownedBit != 0)
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = errors.New("bytes after the addresses")
	}
	if r.err != nil {
		return heartbeat{}, refused(refusedMalformed, fmt.Errorf("heartbeat: %w", r.err))
	}
	if h.Node == "" || h.Parts == 0 || h.Part >= h.Parts {
		return heartbeat{}, refused(refusedMalformed, errors.New("heartbeat: no node, or part out of range"))
	}
	return h, nil
}

// reader reads fields off a heartbeat; a short read sets err and returns
// zeros from then on.
type reader struct {
	b   []byte
	err error
}

func (r *reader) next(n int) []byte {
	if r.err != nil || len(r.b) < n {
		r.err = errors.New("truncated")
		return make([]byte, n)
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) byte() byte { return r.next(1)[0] }

// heartbeats splits one replica's offer into frames that each fit in
// maxPayload, signed with keys; owned marks the addresses it owns; seq
// numbers the frames from next on.
func heartbeats(keys *Keys, group, node string, incarnation uint64, seq *uint64, gen uint32, addrs []netip.Addr, owned map[netip.Addr]bool) [][]byte {
	room := addressRoom(group, node)
	parts := max(1, (len(addrs)+room-1)/room)
	var frames [][]byte
	for p := range parts {
		chunk := addrs[min(p*room, len(addrs)):min((p+1)*room, len(addrs))]
		flags := make([]bool, len(chunk))
		for i, a := range chunk {
			flags[i] = owned[a]
		}
		*seq++
		frames = append(frames, heartbeat{Group: group, Node: node, Incarnation: incarnation, Seq: *seq, Gen: gen, Part: uint8(p), Parts: uint8(parts), Addrs: chunk, Owned: flags}.marshal(keys))
	}
	return frames
}

// addressRoom is how many addresses fit in one frame: the header is the
// magic, the version, the key ID, two lengths and names, the incarnation,
// seq, gen, part, parts and count, and the MAC ends it; an address takes
// at most 17 bytes.
func addressRoom(group, node string) int {
	return (maxPayload - (4 + 1 + 1 + maxKeyID + 1 + len(group) + 1 + len(node) + 8 + 8 + 4 + 2 + 2 + macLen)) / 17
}

// maxAddresses is the most one replica can offer: 255 parts.
func maxAddresses(group, node string) int { return 255 * addressRoom(group, node) }

// maxPeers bounds the replicas a replica keeps track of on a segment;
// a frame from one more is refused until a known one falls silent. Only a
// holder of a key can add one, and each holds at most 255 parts pending.
const maxPeers = 256

// seqWindow is how far behind the latest frame of a peer a frame it has
// not heard yet may come (heard on another interface, overtaken): it
// counts as a sign of life, not as a replay.
const seqWindow = 64

// members is what a replica has heard from the others. Its own lock keeps
// the readers of the segment from waiting on an election.
type members struct {
	deadAfter time.Duration

	mu    sync.Mutex
	peers map[string]*member
	// gone keeps the last frame heard from each peer that fell silent
	// (at most maxPeers): replaying its frames must not bring it back.
	gone map[string]lastFrame
	// released are the addresses a peer stopped owning since the last
	// takeReleased: a neighbour may still send them to it.
	released map[netip.Addr]bool
}

// lastFrame is the latest frame heard from a peer, and when it fell
// silent.
type lastFrame struct {
	incarnation, seq uint64
	at               time.Time
}

// rememberGone is how long a silent peer's last frame is kept. Not for
// ever: a process whose host's clock went back (a bad RTC corrected after
// boot) starts with a lower incarnation than its predecessor, and is heard
// again after this time.
const rememberGone = 10 * time.Minute

// before reports whether a frame of (incarnation, seq) is not newer than f.
func (f lastFrame) before(incarnation, seq uint64) bool {
	return incarnation < f.incarnation || (incarnation == f.incarnation && seq <= f.seq)
}

type member struct {
	seen        time.Time
	incarnation uint64
	seq         uint64
	// window has bit i set when frame seq-1-i was heard.
	window  uint64
	gen     uint32
	offered []netip.Addr
	owned   map[netip.Addr]bool
	// parts of a generation not yet complete
	pendingGen uint32
	pending    map[uint8]heartbeat
}

func newMembers(deadAfter time.Duration) *members {
	return &members{deadAfter: deadAfter, peers: map[string]*member{}, gone: map[string]lastFrame{}, released: map[netip.Addr]bool{}}
}

// observe records a heartbeat heard at now, or says why it refused it;
// fresh reports that it was a frame not heard before. A peer's offer
// changes once every part of a new generation has arrived; until then the
// previous one stands. A frame of the latest process that was overtaken
// by a later one only says the peer is alive.
func (m *members) observe(now time.Time, h heartbeat) (fresh bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.peers[h.Node]
	if p == nil {
		if last, ok := m.gone[h.Node]; ok && now.Sub(last.at) < rememberGone && last.before(h.Incarnation, h.Seq) {
			return false, refused(refusedReplayed, fmt.Errorf("heartbeat %d of %s, which fell silent after %d", h.Seq, h.Node, last.seq))
		}
	}
	switch {
	case p != nil && h.Incarnation < p.incarnation:
		return false, nil // an older process of the node, on its way out
	case p != nil && h.Incarnation == p.incarnation && h.Seq <= p.seq:
		behind := p.seq - h.Seq
		switch {
		case behind == 0 || (behind <= seqWindow && p.window&(1<<(behind-1)) != 0):
			return false, nil // heard already (on another interface)
		case behind > seqWindow:
			return false, refused(refusedReplayed, fmt.Errorf("heartbeat %d of %s, after %d", h.Seq, h.Node, p.seq))
		}
		p.window |= 1 << (behind - 1)
		p.seen = now
		return true, nil
	case p != nil && h.Incarnation > p.incarnation:
		// A new process speaks for the node: what the old one owned, it
		// no longer does.
		for a := range p.owned {
			m.released[a] = true
		}
		p = nil
	}
	if p == nil {
		if m.peers[h.Node] == nil && len(m.peers) >= maxPeers {
			return false, refused(refusedTooManyPeers, fmt.Errorf("heartbeat of %s: already %d peers on the segment", h.Node, len(m.peers)))
		}
		p = &member{incarnation: h.Incarnation}
		m.peers[h.Node] = p
		delete(m.gone, h.Node)
	} else if ahead := h.Seq - p.seq; ahead > seqWindow {
		p.window = 0
	} else {
		p.window = p.window<<ahead | 1<<(ahead-1)
	}
	p.seen, p.seq = now, h.Seq
	m.takeOffer(p, h)
	return true, nil
}

// takeOffer records a part of p's offer; the offer changes once every
// part of a new generation has arrived, and what p stopped owning then is
// noted as released. m.mu is held.
func (m *members) takeOffer(p *member, h heartbeat) {
	if h.Gen == p.gen && p.offered != nil {
		return
	}
	if p.pending == nil || p.pendingGen != h.Gen {
		p.pendingGen, p.pending = h.Gen, map[uint8]heartbeat{}
	}
	p.pending[h.Part] = h
	if len(p.pending) < int(h.Parts) {
		return
	}
	offered, owned := []netip.Addr{}, map[netip.Addr]bool{}
	for i := range h.Parts {
		part, ok := p.pending[i]
		if !ok || part.Parts != h.Parts {
			return // parts of one generation that disagree on their count
		}
		offered = append(offered, part.Addrs...)
		for j, a := range part.Addrs {
			if j < len(part.Owned) && part.Owned[j] {
				owned[a] = true
			}
		}
	}
	slices.SortFunc(offered, netip.Addr.Compare)
	for a := range p.owned {
		if !owned[a] {
			m.released[a] = true
		}
	}
	p.gen, p.offered, p.owned, p.pending = h.Gen, offered, owned, nil
}

// takeReleased returns the addresses peers stopped owning since the last
// call.
func (m *members) takeReleased() map[netip.Addr]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.released
	m.released = map[netip.Addr]bool{}
	return r
}

// live returns the offers of the peers heard within deadAfter of now, and
// forgets the others.
func (m *members) live(now time.Time) map[string][]netip.Addr {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string][]netip.Addr{}
	for node, p := range m.peers {
		if now.Sub(p.seen) > m.deadAfter {
			// Whatever it owned, it no longer answers for.
			for a := range p.owned {
				m.released[a] = true
			}
			delete(m.peers, node)
			m.forget(node, lastFrame{incarnation: p.incarnation, seq: p.seq, at: now})
			continue
		}
		if p.offered != nil {
			out[node] = p.offered
		}
	}
	return out
}

// forget records the last frame of a peer that fell silent, making room
// when maxPeers are recorded (any one goes: a replay of its frames then
// costs an attacker the peer's dead-after time per round, as the peer
// comes back and falls silent again).
func (m *members) forget(node string, last lastFrame) {
	if len(m.gone) >= maxPeers {
		for n := range m.gone {
			delete(m.gone, n)
			break
		}
	}
	m.gone[node] = last
}
