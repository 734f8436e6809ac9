package network

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// podGateway and podGatewayv6 are the addresses every pod's default routes
// point at: the node end of each pod's veth pair carries them, as a routed
// CNI plugin (Calico, for one) does, so no pod needs to know its node's
// addresses.
var (
	podGateway   = netip.MustParseAddr("169.254.1.1")
	podGatewayv6 = netip.MustParseAddr("fe80::1")
)

// Pod is a pod's own network namespace on a node: eth0 with the pod IP,
// joined to the node's host by a veth pair. The node routes the pod IP to
// that pair, more specifically than the node's pod range on its loopback
// (where the simulated pods' servers listen), so one node has pods of both
// kinds.
type Pod struct {
	*Host
	net      *Network
	node     *Host
	nodeLink netlink.Link
}

// AddPod makes the network namespace of a pod with IPs ips (one per family)
// on node (a host of n), named name ("namespace/pod"): Host(name) finds it
// until Close, which removes its link and routes.
func (n *Network) AddPod(node *Host, name string, ips ...netip.Addr) (_ *Pod, retErr error) {
	h, err := newHost(name)
	if err != nil {
		return nil, err
	}
	p := &Pod{Host: h, net: n, node: node}
	// Registered at once (a pod of the same name still closing is
	// replaced: Close forgets only its own).
	n.mu.Lock()
	n.hosts[name] = h
	n.mu.Unlock()
	defer func() {
		if retErr != nil {
			p.Close()
		}
	}()
	n.mu.Lock()
	n.next++
	nodeName, podName := fmt.Sprintf("ebbpod%d", n.next), fmt.Sprintf("ebbtmp%d", n.next)
	n.mu.Unlock()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: nodeName}, PeerName: podName}
	if err := node.nl.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("creating the veth pair of pod %s on %s: %w", name, node.Name, err)
	}
	if p.nodeLink, err = node.nl.LinkByName(nodeName); err != nil {
		return nil, fmt.Errorf("finding %s on %s: %w", nodeName, node.Name, err)
	}
	inner, err := node.nl.LinkByName(podName)
	if err != nil {
		return nil, fmt.Errorf("finding %s on %s: %w", podName, node.Name, err)
	}
	if err := node.nl.LinkSetNsFd(inner, int(h.ns)); err != nil {
		return nil, fmt.Errorf("moving %s into pod %s: %w", podName, name, err)
	}
	var addrs []netip.Prefix
	for _, ip := range ips {
		addrs = append(addrs, netip.PrefixFrom(ip, ip.BitLen()))
	}
	if err := h.configure(podName, "eth0", addrs); err != nil {
		return nil, err
	}
	eth0, err := h.nl.LinkByName("eth0")
	if err != nil {
		return nil, fmt.Errorf("finding eth0 in pod %s: %w", name, err)
	}
	if err := node.nl.LinkSetUp(p.nodeLink); err != nil {
		return nil, fmt.Errorf("bringing up %s on %s: %w", nodeName, node.Name, err)
	}
	for _, ip := range ips {
		if err := p.route(eth0, ip); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// route gives the pod its default route of ip's family through the node
// end of its link, and the node its route to ip over that link.
func (p *Pod) route(eth0 netlink.Link, ip netip.Addr) error {
	gw := netip.PrefixFrom(podGateway, 32)
	if ip.Is6() {
		// A link-local gateway needs no route of its own to be reached.
		gw = netip.PrefixFrom(podGatewayv6, 64)
	} else if err := p.nl.RouteReplace(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipNet(gw), Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("routing to the gateway in pod %s: %w", p.Name, err)
	}
	def := &netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw.Addr().AsSlice()}
	if ip.Is6() {
		def.Dst = ipNet(netip.MustParsePrefix("::/0"))
	}
	if err := p.nl.RouteReplace(def); err != nil {
		return fmt.Errorf("adding the default route of pod %s: %w", p.Name, err)
	}
	if err := p.node.AddAddress(p.nodeLink.Attrs().Name, gw); err != nil {
		return err
	}
	// In table local, so that it wins over the node's pod range on
	// loopback (a local route of the same table, less specific).
	r := &netlink.Route{LinkIndex: p.nodeLink.Attrs().Index, Dst: ipNet(netip.PrefixFrom(ip, ip.BitLen())), Scope: netlink.SCOPE_LINK, Table: unix.RT_TABLE_LOCAL}
	if err := p.node.nl.RouteReplace(r); err != nil {
		return fmt.Errorf("routing pod %s's %s on %s: %w", p.Name, ip, p.node.Name, err)
	}
	return nil
}

// NodeLinkIndex is the index of the node's end of the pod's veth pair, in
// the node's namespace: where a CNI plugin's tc programs (and ebb lb's, on
// an LB host) attach.
func (p *Pod) NodeLinkIndex() int { return p.nodeLink.Attrs().Index }

// Close deletes the pod's link (its routes go with it) and closes the
// namespace handle; the namespace itself goes with its last process.
func (p *Pod) Close() {
	if p.nodeLink != nil {
		_ = p.node.nl.LinkDel(p.nodeLink)
		p.nodeLink = nil
	}
	p.net.mu.Lock()
	if p.net.hosts[p.Name] == p.Host {
		delete(p.net.hosts, p.Name)
	}
	p.net.mu.Unlock()
	p.close()
}
