package l2

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"golang.org/x/net/ipv6"
)

// iface is one announcing interface: a heartbeat socket, and the ARP and
// NDP responders where the interface has an address of that family.
type iface struct {
	ifi *net.Interface
	// v4 is the interface's IPv4 address (none: no ARP).
	v4  netip.Addr
	hb  *packet.Conn
	arp *arp.Client
	// ndp is the NDP responder's socket: nil while the interface has no
	// usable link-local address (none, or still tentative while duplicate
	// address detection runs, as right after the link comes up).
	ndp atomic.Pointer[ndp.Conn]
	// ndpErr says why there was no NDP responder when the interface was
	// opened.
	ndpErr error
	// closed tells its readers that their socket's error is the close
	// (SetInterfaces took the interface away).
	closed atomic.Bool
}

func openInterface(name string) (*iface, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil, fmt.Errorf("L2 announcement on %s: %w", name, err)
	}
	if len(ifi.HardwareAddr) != 6 {
		return nil, fmt.Errorf("L2 announcement on %s: not an Ethernet interface", name)
	}
	ifc := &iface{ifi: ifi}
	if ifc.hb, err = packet.Listen(ifi, packet.Datagram, EtherType, nil); err != nil {
		return nil, fmt.Errorf("opening the heartbeat socket on %s (needs CAP_NET_RAW): %w", name, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		ifc.close()
		return nil, fmt.Errorf("reading the addresses of %s: %w", name, err)
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			ifc.v4 = p.Addr()
			break
		}
	}
	if ifc.v4.IsValid() {
		if ifc.arp, err = arp.Dial(ifi); err != nil {
			ifc.close()
			return nil, fmt.Errorf("opening the ARP socket on %s (needs CAP_NET_RAW): %w", name, err)
		}
	}
	c, err := listenNDP(ifi)
	switch {
	case errors.Is(err, errNoLinkLocal):
		ifc.ndpErr = err
	case err != nil:
		ifc.close()
		return nil, err
	default:
		ifc.ndp.Store(c)
	}
	return ifc, nil
}

// errNoLinkLocal is an interface without a usable link-local address.
var errNoLinkLocal = errors.New("no usable IPv6 link-local address")

// listenNDP opens the NDP responder's socket on ifi, hearing only
// neighbour solicitations.
func listenNDP(ifi *net.Interface) (*ndp.Conn, error) {
	c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoLinkLocal, err)
	}
	var f ipv6.ICMPFilter
	f.SetAll(true)
	f.Accept(ipv6.ICMPTypeNeighborSolicitation)
	if err := c.SetICMPFilter(&f); err != nil {
		c.Close()
		return nil, fmt.Errorf("filtering ICMPv6 on %s: %w", ifi.Name, err)
	}
	return c, nil
}

func (i *iface) close() {
	i.closed.Store(true)
	if i.hb != nil {
		i.hb.Close()
	}
	if i.arp != nil {
		i.arp.Close()
	}
	if c := i.ndp.Load(); c != nil {
		c.Close()
	}
}

func (i *iface) broadcast(frame []byte) error {
	_, err := i.hb.WriteTo(frame, &packet.Addr{HardwareAddr: ethernet.Broadcast})
	return err
}

// announce tells the segment that addr is at this interface: a gratuitous
// ARP request and reply (neighbours differ in which they heed), or an
// unsolicited neighbour advertisement that overrides cached entries.
func (i *iface) announce(addr netip.Addr) error {
	if addr.Is4() {
		if i.arp == nil {
			return errors.New("no IPv4 address on the interface")
		}
		var errs []error
		for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
			p, err := arp.NewPacket(op, i.ifi.HardwareAddr, addr, ethernet.Broadcast, addr)
			if err == nil {
				err = i.arp.WriteTo(p, ethernet.Broadcast)
			}
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
	c := i.ndp.Load()
	if c == nil {
		return fmt.Errorf("no NDP on the interface: %w", i.ndpErr)
	}
	na := &ndp.NeighborAdvertisement{Override: true, TargetAddress: addr,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: i.ifi.HardwareAddr}}}
	return c.WriteTo(na, nil, netip.IPv6LinkLocalAllNodes())
}

// join joins (or leaves) addr's solicited-node multicast group.
func (i *iface) join(addr netip.Addr, on bool) error {
	c := i.ndp.Load()
	if c == nil {
		return nil
	}
	group, err := ndp.SolicitedNodeMulticast(addr)
	if err != nil {
		return err
	}
	if on {
		return c.JoinGroup(group)
	}
	return c.LeaveGroup(group)
}

// readHeartbeats hands every heartbeat heard on ifc to the membership.
func (a *Announcer) readHeartbeats(ifc *iface) {
	buf := make([]byte, maxPayload)
	for {
		n, _, err := ifc.hb.ReadFrom(buf)
		if err != nil {
			if !a.stopping.Load() && !ifc.closed.Load() {
				a.log.Error(err, "Reading heartbeats", "interface", ifc.ifi.Name)
			}
			return
		}
		h, err := parseHeartbeat(buf[:n], a.keys.Load())
		if err == nil {
			err = a.observe(h)
		}
		if err != nil {
			a.refusedFrame(ifc, err)
		}
	}
}

// answerARP answers the ARP requests for the addresses this replica owns.
func (a *Announcer) answerARP(ifc *iface) {
	for {
		p, _, err := ifc.arp.Read()
		if err != nil {
			if !a.stopping.Load() && !ifc.closed.Load() {
				a.log.Error(err, "Reading ARP", "interface", ifc.ifi.Name)
			}
			return
		}
		// A gratuitous one (sender = target) is someone else's news.
		if p.Operation != arp.OperationRequest || p.SenderIP == p.TargetIP || !a.ownsOn(p.TargetIP, ifc) {
			continue
		}
		if err := ifc.arp.Reply(p, ifc.ifi.HardwareAddr, p.TargetIP); err != nil {
			a.log.V(1).Info("Answering ARP failed", "address", p.TargetIP, "interface", ifc.ifi.Name, "error", err.Error())
		}
	}
}

// answerNDP answers the neighbour solicitations for the addresses this
// replica owns.
func (a *Announcer) answerNDP(ifc *iface) {
	conn := ifc.ndp.Load()
	for {
		m, _, from, err := conn.ReadFrom()
		if err != nil {
			if !a.stopping.Load() && !ifc.closed.Load() {
				a.log.Error(err, "Reading NDP", "interface", ifc.ifi.Name)
			}
			return
		}
		ns, ok := m.(*ndp.NeighborSolicitation)
		if !ok || !a.ownsOn(ns.TargetAddress, ifc) {
			continue
		}
		na := &ndp.NeighborAdvertisement{Solicited: true, Override: true, TargetAddress: ns.TargetAddress,
			Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: ifc.ifi.HardwareAddr}}}
		to := from
		if from.Unmap().IsUnspecified() {
			// Duplicate address detection: tell everyone.
			na.Solicited, to = false, netip.IPv6LinkLocalAllNodes()
		}
		if err := conn.WriteTo(na, nil, to); err != nil {
			a.log.V(1).Info("Answering NDP failed", "address", ns.TargetAddress, "interface", ifc.ifi.Name, "error", err.Error())
		}
	}
}
