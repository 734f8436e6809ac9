package network

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// SYNTap watches every interface of the root host, the bridge and the
// hosts' ports on it among them, and records when a new TCP connection (a
// SYN without ACK) was last sent to one address on a port in a range: a
// load balancer, on the control-plane host or on a node's host, opening a
// connection to a node's node ports, say, but not to its health port and
// not connections kube-proxies forward to the node's pods (those go to pod
// IPs). It sees the SYN enter the bridge even when the node is cut off
// (Disconnect). Connections a host opens to itself never cross the bridge
// and are not seen. Benchmarks and the demo read "the last new connection
// a node was sent" from it, with real kube-proxy handling the connection
// itself.
type SYNTap struct {
	dst       netip.Addr
	firstPort uint16
	lastPort  uint16
	file      *os.File

	mu   sync.Mutex
	last map[uint16]time.Time // by destination port
}

// TapSYNs starts a SYNTap for connections to dst on ports
// firstPort..lastPort; it stops when ctx is done.
func (n *Network) TapSYNs(ctx context.Context, dst netip.Addr, firstPort, lastPort uint16) (*SYNTap, error) {
	file, err := openTap(synFilter(), "syntap-"+dst.String())
	if err != nil {
		return nil, err
	}
	// A SYN seen twice on its way (the bridge, then the node's port)
	// changes no "last".
	t := &SYNTap{dst: dst, firstPort: firstPort, lastPort: lastPort, last: map[uint16]time.Time{}, file: file}
	go t.read()
	go func() {
		<-ctx.Done()
		_ = t.file.Close()
	}()
	return t, nil
}

// Last returns when the last matching SYN to one of ports was seen (no
// ports: any port of the range; zero: none yet).
func (t *SYNTap) Last(ports ...uint16) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	var last time.Time
	if len(ports) == 0 {
		for _, at := range t.last {
			if at.After(last) {
				last = at
			}
		}
		return last
	}
	for _, p := range ports {
		if at := t.last[p]; at.After(last) {
			last = at
		}
	}
	return last
}

func (t *SYNTap) read() {
	buf := make([]byte, snapLen)
	for {
		n, err := t.file.Read(buf)
		if errors.Is(err, os.ErrClosed) {
			return
		}
		if err != nil {
			// ENETDOWN while the link is cut (Disconnect): the socket
			// keeps working once it is up again.
			time.Sleep(time.Millisecond)
			continue
		}
		now := time.Now()
		if dst, port, ok := synDestination(buf[:n]); ok && dst == t.dst && port >= t.firstPort && port <= t.lastPort {
			t.mu.Lock()
			t.last[port] = now
			t.mu.Unlock()
		}
	}
}

// snapLen covers Ethernet, an IPv6 header and the TCP ports and flags.
const snapLen = 96

// synFilter passes only TCP segments with SYN set and ACK clear, over IPv4
// (no fragments) or IPv6 (TCP as the first next header), cut to snapLen.
func synFilter() []bpf.Instruction {
	const (
		synAck = 0x12
		syn    = 0x02
	)
	const drop = 17
	return []bpf.Instruction{
		/* 0 */ bpf.LoadAbsolute{Off: 12, Size: 2}, // ethertype
		/* 1 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0x0800, SkipFalse: 10 - 2}, // IPv4, else try IPv6
		/* 2 */ bpf.LoadAbsolute{Off: 14 + 9, Size: 1}, // IPv4 protocol
		/* 3 */ bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_TCP, SkipTrue: drop - 4},
		/* 4 */ bpf.LoadAbsolute{Off: 14 + 6, Size: 2}, // flags and fragment offset
		/* 5 */ bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipTrue: drop - 6}, // not the first fragment
		/* 6 */ bpf.LoadMemShift{Off: 14}, // X = IPv4 header length
		/* 7 */ bpf.LoadIndirect{Off: 14 + 13, Size: 1}, // TCP flags
		/* 8 */ bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: synAck},
		/* 9 */ bpf.Jump{Skip: 15 - 10},
		/* 10 */ bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 0x86dd, SkipTrue: drop - 11},
		/* 11 */ bpf.LoadAbsolute{Off: 14 + 6, Size: 1}, // IPv6 next header
		/* 12 */ bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_TCP, SkipTrue: drop - 13},
		/* 13 */ bpf.LoadAbsolute{Off: 14 + 40 + 13, Size: 1}, // TCP flags
		/* 14 */ bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: synAck},
		/* 15 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: syn, SkipFalse: drop - 16},
		/* 16 */ bpf.RetConstant{Val: snapLen},
		/* drop */ bpf.RetConstant{Val: 0},
	}
}

// synDestination reads the destination address and port of an Ethernet
// frame that synFilter passed.
func synDestination(frame []byte) (netip.Addr, uint16, bool) {
	if len(frame) < 14 {
		return netip.Addr{}, 0, false
	}
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case 0x0800:
		if len(frame) < 14+20 {
			return netip.Addr{}, 0, false
		}
		ihl := int(frame[14]&0x0f) * 4
		if len(frame) < 14+ihl+4 {
			return netip.Addr{}, 0, false
		}
		dst := netip.AddrFrom4([4]byte(frame[30:34]))
		return dst, binary.BigEndian.Uint16(frame[14+ihl+2:]), true
	case 0x86dd:
		if len(frame) < 14+40+4 {
			return netip.Addr{}, 0, false
		}
		dst := netip.AddrFrom16([16]byte(frame[38:54]))
		return dst, binary.BigEndian.Uint16(frame[14+40+2:]), true
	}
	return netip.Addr{}, 0, false
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
