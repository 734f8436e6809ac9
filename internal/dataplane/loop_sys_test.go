package dataplane

import (
	"net/netip"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A socket address written for the kernel reads back the same, with the
// port in network byte order.
func TestRawSockaddrRoundTrip(t *testing.T) {
	for _, s := range []string{"10.1.2.3:80", "127.0.0.1:65535", "[fd00::1]:8443", "[::ffff:10.0.0.1]:1", "0.0.0.0:0"} {
		ap := netip.MustParseAddrPort(s)
		var sa unix.RawSockaddrAny
		n := putSockaddr(&sa, ap)
		got := addrPortOfRaw(&sa)
		want := netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		if got != want {
			t.Errorf("%s: read back %s", s, got)
		}
		port := (*[2]byte)(unsafe.Pointer(&(*unix.RawSockaddrInet4)(unsafe.Pointer(&sa)).Port))
		if port[0] != byte(ap.Port()>>8) || port[1] != byte(ap.Port()) {
			t.Errorf("%s: port bytes %v, want network byte order", s, port)
		}
		if wantLen := map[bool]int{true: unix.SizeofSockaddrInet4, false: unix.SizeofSockaddrInet6}[want.Addr().Is4()]; n != wantLen {
			t.Errorf("%s: length %d, want %d", s, n, wantLen)
		}
	}
}
