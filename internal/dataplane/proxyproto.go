package dataplane

import (
	"encoding/binary"
	"net/netip"
)

// proxyV2Signature starts every PROXY protocol v2 header.
var proxyV2Signature = []byte("\r\n\r\n\x00\r\nQUIT\n")

// proxyHeaderV2 returns a PROXY protocol v2 header (PROXY command, TCP over
// IPv4 or IPv6) telling the backend the client's address and the address
// the client connected to.
func proxyHeaderV2(src, dst netip.AddrPort) []byte {
	src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	v4 := src.Addr().Is4() && dst.Addr().Is4()
	hdr := make([]byte, 0, 16+36)
	hdr = append(hdr, proxyV2Signature...)
	hdr = append(hdr, 0x21) // version 2, command PROXY
	if v4 {
		hdr = append(hdr, 0x11) // AF_INET, STREAM
		hdr = binary.BigEndian.AppendUint16(hdr, 12)
		s, d := src.Addr().As4(), dst.Addr().As4()
		hdr = append(hdr, s[:]...)
		hdr = append(hdr, d[:]...)
	} else {
		hdr = append(hdr, 0x21) // AF_INET6, STREAM
		hdr = binary.BigEndian.AppendUint16(hdr, 36)
		s, d := src.Addr().As16(), dst.Addr().As16()
		hdr = append(hdr, s[:]...)
		hdr = append(hdr, d[:]...)
	}
	hdr = binary.BigEndian.AppendUint16(hdr, src.Port())
	hdr = binary.BigEndian.AppendUint16(hdr, dst.Port())
	return hdr
}
