package network

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// WaitNeighbor makes the host resolve addr, a neighbour on one of its
// links, and waits until it has: it sends addr a UDP datagram (to the
// discard port) and watches the neighbour table. Under load, a first
// IPv6 neighbour solicitation between new hosts was lost now and then
// (most likely sent before the new address had joined its solicited-node
// group, which the kernel does from a work queue; resolving first made
// the loss go away, 0 in 400 runs against about 2 in 100), and the packet
// that needed it waited a second for the solicitation's retry: a test's
// first connection then took a second, or failed a deadline under that.
func (h *Host) WaitNeighbor(ctx context.Context, addr netip.Addr) error {
	family := netlink.FAMILY_V4
	if addr.Is6() {
		family = netlink.FAMILY_V6
	}
	const resolved = unix.NUD_REACHABLE | unix.NUD_STALE | unix.NUD_DELAY | unix.NUD_PROBE | unix.NUD_PERMANENT
	for {
		neighbors, err := h.nl.NeighList(0, family)
		if err != nil {
			return fmt.Errorf("listing the neighbours of %s: %w", h.Name, err)
		}
		for _, n := range neighbors {
			if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == addr && n.State&resolved != 0 {
				return nil
			}
		}
		// A datagram while the entry is incomplete only waits in its
		// queue; the kernel retries the solicitation by itself.
		c, err := h.DialContext(ctx, "udp", netip.AddrPortFrom(addr, 9).String())
		if err != nil {
			return fmt.Errorf("sending %s a datagram from %s: %w", addr, h.Name, err)
		}
		_, _ = c.Write([]byte{0})
		_ = c.Close()
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not resolve its neighbour %s: %w", h.Name, addr, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
