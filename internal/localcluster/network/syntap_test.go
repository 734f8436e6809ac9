package network

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// frame builds an Ethernet frame carrying a TCP segment to dst:port with
// the given flags.
func frame(dst netip.Addr, port uint16, flags byte, fragOffset uint16) []byte {
	eth := make([]byte, 14)
	var ip []byte
	if dst.Is4() {
		binary.BigEndian.PutUint16(eth[12:], 0x0800)
		ip = make([]byte, 20)
		ip[0] = 0x45
		ip[9] = 6
		binary.BigEndian.PutUint16(ip[6:], fragOffset)
		copy(ip[16:20], dst.AsSlice())
	} else {
		binary.BigEndian.PutUint16(eth[12:], 0x86dd)
		ip = make([]byte, 40)
		ip[0] = 0x60
		ip[6] = 6
		copy(ip[24:40], dst.AsSlice())
	}
	tcp := make([]byte, 20)
	binary.BigEndian.PutUint16(tcp[0:], 40000)
	binary.BigEndian.PutUint16(tcp[2:], port)
	tcp[13] = flags
	return append(append(eth, ip...), tcp...)
}

func TestSYNFilterAndDestination(t *testing.T) {
	vm, err := filterVM(synFilter())
	if err != nil {
		t.Fatal(err)
	}
	v4, v6 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00:10::1")
	const (
		syn    = 0x02
		synAck = 0x12
		ack    = 0x10
	)
	tests := []struct {
		name  string
		frame []byte
		pass  bool
	}{
		{"IPv4 SYN", frame(v4, 30080, syn, 0), true},
		{"IPv4 SYN-ACK", frame(v4, 30080, synAck, 0), false},
		{"IPv4 ACK", frame(v4, 30080, ack, 0), false},
		{"IPv4 later fragment", frame(v4, 30080, syn, 0x0010), false},
		{"IPv6 SYN", frame(v6, 30080, syn, 0), true},
		{"IPv6 ACK", frame(v6, 30080, ack, 0), false},
		{"ARP", append(make([]byte, 12), 0x08, 0x06, 0, 0, 0, 0), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := vm.Run(tt.frame)
			if err != nil {
				t.Fatal(err)
			}
			if got := n > 0; got != tt.pass {
				t.Fatalf("filter passed=%v, want %v", got, tt.pass)
			}
			if !tt.pass {
				return
			}
			dst, port, ok := synDestination(tt.frame[:min(n, len(tt.frame))])
			want := v4
			if tt.frame[12] == 0x86 {
				want = v6
			}
			if !ok || dst != want || port != 30080 {
				t.Fatalf("destination %s:%d (ok %v), want %s:30080", dst, port, ok, want)
			}
		})
	}
}
