// Package synflood sends bare TCP SYNs from any IPv4 source address and
// port, as a SYN flood does: the sender keeps no state and answers
// nothing, so that what the receiver does with half-open connections is
// what is measured. The eBPF path's test of half-open flows and
// bench-abuse share it.
package synflood

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"
)

const (
	ipHeaderLen  = 20
	tcpHeaderLen = 20
	tcpFlagSYN   = 0x02
)

// Sender sends SYNs through a raw socket of the network namespace it was
// opened in.
type Sender struct {
	fd  int
	pkt [ipHeaderLen + tcpHeaderLen]byte
}

// Open opens a raw socket in the calling thread's network namespace
// (needs CAP_NET_RAW). The kernel fills in the IP header's checksum and
// length; the sender writes the rest, source address included.
func Open() (*Sender, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return nil, fmt.Errorf("opening a raw IPv4 socket: %w", err)
	}
	return &Sender{fd: fd}, nil
}

// Close closes the socket.
func (s *Sender) Close() error { return unix.Close(s.fd) }

// Send sends one SYN from src to dst with the initial sequence number
// seq. Both must be IPv4.
func (s *Sender) Send(src, dst netip.AddrPort, seq uint32) error {
	if !src.Addr().Is4() || !dst.Addr().Is4() {
		return fmt.Errorf("sending a SYN from %s to %s: IPv4 only", src, dst)
	}
	Build(s.pkt[:], src, dst, seq)
	to := &unix.SockaddrInet4{Addr: dst.Addr().As4()}
	if err := unix.Sendto(s.fd, s.pkt[:], 0, to); err != nil {
		return fmt.Errorf("sending a SYN from %s to %s: %w", src, dst, err)
	}
	return nil
}

// Build writes a SYN from src to dst with sequence number seq into pkt
// (at least 40 bytes): an IPv4 header without options (checksum 0, which
// a raw socket's kernel fills in) and a TCP header with its checksum.
func Build(pkt []byte, src, dst netip.AddrPort, seq uint32) {
	ip, tcp := pkt[:ipHeaderLen], pkt[ipHeaderLen:ipHeaderLen+tcpHeaderLen]
	clear(pkt[:ipHeaderLen+tcpHeaderLen])
	ip[0] = 0x45 // version 4, 5 words
	binary.BigEndian.PutUint16(ip[2:4], ipHeaderLen+tcpHeaderLen)
	ip[8], ip[9] = 64, unix.IPPROTO_TCP
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(tcp[0:2], src.Port())
	binary.BigEndian.PutUint16(tcp[2:4], dst.Port())
	binary.BigEndian.PutUint32(tcp[4:8], seq)
	tcp[12] = tcpHeaderLen / 4 << 4
	tcp[13] = tcpFlagSYN
	binary.BigEndian.PutUint16(tcp[14:16], 64240) // window
	binary.BigEndian.PutUint16(tcp[16:18], tcpChecksum(s4, d4, tcp))
}

// tcpChecksum is the checksum of the TCP segment seg (its checksum field
// zero) with the IPv4 pseudo-header of src and dst.
func tcpChecksum(src, dst [4]byte, seg []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(src[:])
	add(dst[:])
	sum += unix.IPPROTO_TCP + uint32(len(seg))
	add(seg)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// DropAnswers has the calling thread's network namespace drop the TCP
// SYN-ACKs to the addresses to (an nftables table of that name), so that
// SYNs sent from them stay half-open and the host never resets them, as
// with a flood from spoofed addresses. Needs the nft binary.
func DropAnswers(table string, to []netip.Addr) error {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(dropAnswersRuleset(table, to))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("dropping the SYN-ACKs to %v (nft): %w: %s", to, err, out)
	}
	return nil
}

// dropAnswersRuleset is DropAnswers' nftables table.
func dropAnswersRuleset(table string, to []netip.Addr) string {
	addrs := make([]string, len(to))
	for i, a := range to {
		addrs[i] = a.String()
	}
	return fmt.Sprintf(`table inet %s {
	chain in {
		type filter hook input priority 0;
		ip daddr { %s } tcp flags & (syn | ack) == syn | ack drop
	}
}
`, table, strings.Join(addrs, ", "))
}
