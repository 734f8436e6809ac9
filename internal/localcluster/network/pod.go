package network

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// podGateway is the address every pod's default route points at: the node
// end of each pod's veth pair carries it, as a routed CNI plugin (Calico,
// for one) does, so no pod needs to know its node's address.
var podGateway = netip.MustParseAddr("169.254.1.1")

// Pod is a pod's own network namespace on a node: eth0 with the pod IP,
// joined to the node's host by a veth pair. The node routes the pod IP to
// that pair, more specifically than the node's pod range on its loopback
// (where the simulated pods' servers listen), so one node has pods of both
// kinds.
type Pod struct {
	*Host
	node     *Host
	nodeLink netlink.Link
}

// AddPod makes the network namespace of a pod with IP ip on node (a host of
// n). Close removes its link and routes.
func (n *Network) AddPod(node *Host, name string, ip netip.Addr) (_ *Pod, retErr error) {
	if !ip.Is4() {
		return nil, fmt.Errorf("pod %s: only IPv4 pod addresses are supported, not %s", name, ip)
	}
	h, err := newHost(name)
	if err != nil {
		return nil, err
	}
	p := &Pod{Host: h, node: node}
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
	if err := h.configure(podName, "eth0", []netip.Prefix{netip.PrefixFrom(ip, 32)}); err != nil {
		return nil, err
	}
	eth0, err := h.nl.LinkByName("eth0")
	if err != nil {
		return nil, fmt.Errorf("finding eth0 in pod %s: %w", name, err)
	}
	gw := netip.PrefixFrom(podGateway, 32)
	if err := h.nl.RouteReplace(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipNet(gw), Scope: netlink.SCOPE_LINK}); err != nil {
		return nil, fmt.Errorf("routing to the gateway in pod %s: %w", name, err)
	}
	if err := h.nl.RouteReplace(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: podGateway.AsSlice()}); err != nil {
		return nil, fmt.Errorf("adding the default route of pod %s: %w", name, err)
	}
	if err := node.nl.LinkSetUp(p.nodeLink); err != nil {
		return nil, fmt.Errorf("bringing up %s on %s: %w", nodeName, node.Name, err)
	}
	if err := node.AddAddress(nodeName, gw); err != nil {
		return nil, err
	}
	// In table local, so that it wins over the node's pod range on
	// loopback (a local route of the same table, less specific).
	route := &netlink.Route{LinkIndex: p.nodeLink.Attrs().Index, Dst: ipNet(netip.PrefixFrom(ip, 32)), Scope: netlink.SCOPE_LINK, Table: unix.RT_TABLE_LOCAL}
	if err := node.nl.RouteReplace(route); err != nil {
		return nil, fmt.Errorf("routing pod %s's %s on %s: %w", name, ip, node.Name, err)
	}
	return p, nil
}

// Close deletes the pod's link (its routes go with it) and closes the
// namespace handle; the namespace itself goes with its last process.
func (p *Pod) Close() {
	if p.nodeLink != nil {
		_ = p.node.nl.LinkDel(p.nodeLink)
		p.nodeLink = nil
	}
	p.close()
}
