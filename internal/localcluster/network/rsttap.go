package network

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// RSTTap records the TCP resets (IPv4 segments with RST set) that cross
// the root host's interfaces, the bridge's ports among them: every reset
// one host of the network sends another (not those the root host, where
// the control plane runs, sends itself; those it receives are seen on its
// port and on the bridge, twice). A test that sees a connection
// reset reads from it which host sent the reset (by its source MAC
// address), for which connection, and when.
type RSTTap struct {
	file *os.File

	mu     sync.Mutex
	seen   []RST
	missed int
}

// RST is one reset seen entering the bridge from the host that sent it.
type RST struct {
	At       time.Time
	From     net.HardwareAddr
	Src, Dst netip.AddrPort
}

func (r RST) String() string {
	return fmt.Sprintf("%s %s -> %s from MAC %s", r.At.UTC().Format("15:04:05.000"), r.Src, r.Dst, r.From)
}

// maxRSTs bounds what an RSTTap keeps.
const maxRSTs = 10000

// TapRSTs starts an RSTTap; it stops when ctx is done.
func (n *Network) TapRSTs(ctx context.Context) (*RSTTap, error) {
	file, err := openTap(rstFilter(), "rsttap")
	if err != nil {
		return nil, err
	}
	t := &RSTTap{file: file}
	go t.read(ctx)
	go func() {
		<-ctx.Done()
		_ = t.file.Close()
	}()
	return t, nil
}

// Since returns the resets seen at or after from, and how many were not
// kept (past maxRSTs).
func (t *RSTTap) Since(from time.Time) ([]RST, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []RST
	for _, r := range t.seen {
		if !r.At.Before(from) {
			out = append(out, r)
		}
	}
	return out, t.missed
}

func (t *RSTTap) read(ctx context.Context) {
	buf := make([]byte, snapLen)
	rc, err := t.file.SyscallConn()
	if err != nil {
		return
	}
	for {
		var n int
		var from unix.Sockaddr
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			n, from, rerr = unix.Recvfrom(int(fd), buf, 0)
			return !errors.Is(rerr, unix.EAGAIN)
		})
		if ctx.Err() != nil || errors.Is(err, os.ErrClosed) {
			return // closed: RawConn.Read says so in its own words
		}
		if err != nil || rerr != nil {
			time.Sleep(time.Millisecond) // ENETDOWN while a link is cut
			continue
		}
		// A reset crossing the bridge is seen entering it from its
		// sender and leaving it to its receiver: keep the first.
		if ll, ok := from.(*unix.SockaddrLinklayer); !ok || ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		r, ok := parseRST(buf[:n])
		if !ok {
			continue
		}
		r.At = time.Now()
		t.mu.Lock()
		if len(t.seen) < maxRSTs {
			t.seen = append(t.seen, r)
		} else {
			t.missed++
		}
		t.mu.Unlock()
	}
}

// rstFilter passes only IPv4 TCP segments with RST set (first fragments),
// cut to snapLen.
func rstFilter() []bpf.Instruction {
	const rst = 0x04
	const drop = 10
	return []bpf.Instruction{
		/* 0 */ bpf.LoadAbsolute{Off: 12, Size: 2}, // ethertype
		/* 1 */ bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 0x0800, SkipTrue: drop - 2},
		/* 2 */ bpf.LoadAbsolute{Off: 14 + 9, Size: 1}, // IPv4 protocol
		/* 3 */ bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_TCP, SkipTrue: drop - 4},
		/* 4 */ bpf.LoadAbsolute{Off: 14 + 6, Size: 2}, // flags and fragment offset
		/* 5 */ bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipTrue: drop - 6},
		/* 6 */ bpf.LoadMemShift{Off: 14}, // X = IPv4 header length
		/* 7 */ bpf.LoadIndirect{Off: 14 + 13, Size: 1}, // TCP flags
		/* 8 */ bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: rst, SkipFalse: drop - 9},
		/* 9 */ bpf.RetConstant{Val: snapLen},
		/* drop */ bpf.RetConstant{Val: 0},
	}
}

// parseRST reads the sender's MAC address and the addresses of an
// Ethernet frame that rstFilter passed.
func parseRST(frame []byte) (RST, bool) {
	if len(frame) < 14+20 {
		return RST{}, false
	}
	ihl := int(frame[14]&0x0f) * 4
	if ihl < 20 || len(frame) < 14+ihl+4 {
		return RST{}, false
	}
	l4 := frame[14+ihl:]
	return RST{
		From: net.HardwareAddr(append([]byte(nil), frame[6:12]...)),
		Src:  netip.AddrPortFrom(netip.AddrFrom4([4]byte(frame[26:30])), binary.BigEndian.Uint16(l4[0:2])),
		Dst:  netip.AddrPortFrom(netip.AddrFrom4([4]byte(frame[30:34])), binary.BigEndian.Uint16(l4[2:4])),
	}, true
}

// HostsByMAC maps each host's eth0 (its port on the bridge) MAC address,
// as net.HardwareAddr.String writes it, to the host's name.
func (n *Network) HostsByMAC() map[string]string {
	n.mu.Lock()
	hosts := make([]*Host, 0, len(n.hosts))
	for _, h := range n.hosts {
		hosts = append(hosts, h)
	}
	n.mu.Unlock()
	out := make(map[string]string, len(hosts))
	for _, h := range hosts {
		if hw, err := h.HardwareAddr("eth0"); err == nil {
			out[hw.String()] = h.Name
		}
	}
	return out
}
