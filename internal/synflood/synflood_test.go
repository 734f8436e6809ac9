package synflood

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// A SYN Build writes checks out as the receiver checks it: the one's
// complement sum of the pseudo-header and the segment, checksum
// included, is all ones; and its fields are where TCP has them.
func TestBuildWritesAValidSYN(t *testing.T) {
	for _, tc := range []struct {
		src, dst string
		seq      uint32
	}{
		{"10.2.0.3:1024", "10.9.0.1:80", 0},
		{"192.168.255.254:65535", "10.0.0.1:443", 0xffffffff},
		{"1.2.3.4:40000", "5.6.7.8:8080", 123456789},
	} {
		src, dst := netip.MustParseAddrPort(tc.src), netip.MustParseAddrPort(tc.dst)
		pkt := make([]byte, 40)
		Build(pkt, src, dst, tc.seq)
		tcp := pkt[20:]
		if got := tcpChecksum(src.Addr().As4(), dst.Addr().As4(), tcp); got != 0 {
			t.Errorf("%s -> %s: the segment with its checksum sums to %#04x, want 0 (all ones, complemented)", src, dst, got)
		}
		if pkt[0] != 0x45 || pkt[9] != 6 || binary.BigEndian.Uint16(pkt[2:]) != 40 {
			t.Errorf("%s -> %s: IP header %x, want version 4, 20 bytes, protocol TCP, length 40", src, dst, pkt[:20])
		}
		if netip.AddrFrom4([4]byte(pkt[12:16])) != src.Addr() || netip.AddrFrom4([4]byte(pkt[16:20])) != dst.Addr() {
			t.Errorf("%s -> %s: addresses %x", src, dst, pkt[12:20])
		}
		if binary.BigEndian.Uint16(tcp[0:]) != src.Port() || binary.BigEndian.Uint16(tcp[2:]) != dst.Port() ||
			binary.BigEndian.Uint32(tcp[4:]) != tc.seq || tcp[13] != tcpFlagSYN || tcp[12]>>4 != 5 {
			t.Errorf("%s -> %s: TCP header %x, want the ports, sequence %d, 5 words, SYN only", src, dst, tcp, tc.seq)
		}
	}
}

// The checksum of one SYN (10.0.0.1:12345 to 10.0.0.2:80, sequence 1,
// window 64240, no options) as an independent implementation of RFC
// 1071's sum gives it (Python's struct over the same bytes): 0x7065.
func TestChecksumOfAKnownSegment(t *testing.T) {
	pkt := make([]byte, 40)
	Build(pkt, netip.MustParseAddrPort("10.0.0.1:12345"), netip.MustParseAddrPort("10.0.0.2:80"), 1)
	if got := binary.BigEndian.Uint16(pkt[36:38]); got != 0x7065 {
		t.Errorf("checksum %#04x, want 0x7065", got)
	}
}

func TestDropAnswersRuleset(t *testing.T) {
	got := dropAnswersRuleset("flood", []netip.Addr{netip.MustParseAddr("10.2.0.3"), netip.MustParseAddr("10.2.0.4")})
	want := "table inet flood {\n\tchain in {\n\t\ttype filter hook input priority 0;\n\t\tip daddr { 10.2.0.3, 10.2.0.4 } tcp flags & (syn | ack) == syn | ack drop\n\t}\n}\n"
	if got != want {
		t.Errorf("ruleset:\n%s\nwant:\n%s", got, want)
	}
}
