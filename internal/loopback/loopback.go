// Package loopback hands out loopback addresses for tests and benchmarks
// that must name a port before something listens on it.
package loopback

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
)

// FreeAddr returns a random address of 127.0.0.0/8 (all of it is local on
// Linux) and a port that was free on it a moment ago, for network "tcp" or
// "udp". Listening on port 0, closing and listening again later on
// 127.0.0.1 races with every other socket of the host that takes an
// ephemeral port there; nobody else uses a random 127.x.y.z, so the port
// stays free until its caller binds it.
func FreeAddr(network string) (netip.AddrPort, error) {
	ip := netip.AddrFrom4([4]byte{127, byte(1 + rand.IntN(254)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
	at := netip.AddrPortFrom(ip, 0).String()
	switch network {
	case "udp":
		c, err := net.ListenPacket("udp4", at)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("finding a free UDP port: %w", err)
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).AddrPort(), nil
	default:
		ln, err := net.Listen("tcp4", at)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("finding a free TCP port: %w", err)
		}
		defer ln.Close()
		return ln.Addr().(*net.TCPAddr).AddrPort(), nil
	}
}
