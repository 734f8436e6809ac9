package localcluster

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// The cluster's network (docs/local-cluster.md draws it), dual-stack: every
// host has an IPv4 and an IPv6 address, IPv4 first:
//
//	client 10.1.0.2 ── 10.1.0.1 router 10.0.0.253 ──┐
//	       fd00:11::2   fd00:11::1    fd00:10::fd   │
//	                                                 ├─ bridge ebb-nodes (10.0.0.0/24, fd00:10::/64)
//	control plane 10.0.0.254, fd00:10::fe ──────────┤
//	node-1 10.0.0.1, fd00:10::1 ─────────────────────┤  (pods 10.244.1.0/24, fd00:244:0:1::/64)
//	node-2 10.0.0.2, fd00:10::2 ...           ───────┘
//
// Each box is a network namespace. The control-plane host is the namespace
// this process runs in (made by Reexec): the apiserver, etcd, the
// controllers, kwok, ebb's processes started by tests, and the tests
// themselves run there. Each node runs its own kube-proxy and its pods'
// servers. No VIP is configured on any host: ebb lb adds a local route for
// each VIP it serves (internal/vipaddr) where it runs, on the control-plane
// host for now, and the router has a static route to each VIP pool through
// it.
var (
	// ClientCIDR is the client subnet behind the router.
	ClientCIDR = netip.MustParsePrefix("10.1.0.0/24")
	// ClientIP is the client host's address.
	ClientIP = netip.MustParseAddr("10.1.0.2")
	// RouterIP is the router's address on the node network; every host's
	// default route points at it.
	RouterIP = netip.MustParseAddr("10.0.0.253")
	// ControlPlaneIP is the control-plane host's address on the node
	// network: the apiserver serves there.
	ControlPlaneIP = netip.MustParseAddr(controlPlaneIP)

	// VIPPrefix is VIPCIDR as a prefix.
	VIPPrefix = netip.MustParsePrefix(VIPCIDR.String())

	// ClientCIDRv6, ClientIPv6, RouterIPv6, ControlPlaneIPv6 and
	// VIPPrefixv6 are the IPv6 twins of the above.
	ClientCIDRv6     = netip.MustParsePrefix("fd00:11::/64")
	ClientIPv6       = netip.MustParseAddr("fd00:11::2")
	RouterIPv6       = netip.MustParseAddr("fd00:10::fd")
	ControlPlaneIPv6 = netip.MustParseAddr("fd00:10::fe")
	VIPPrefixv6      = netip.MustParsePrefix(VIPCIDRv6.String())

	routerClientSide   = netip.MustParseAddr("10.1.0.1")
	routerClientSidev6 = netip.MustParseAddr("fd00:11::1")
	defaultRoute       = netip.MustParsePrefix("0.0.0.0/0")
	defaultRoutev6     = netip.MustParsePrefix("::/0")
)

// Names of the hosts that are not nodes.
const (
	HostControlPlane = "control-plane"
	HostRouter       = "router"
	HostClient       = "client"
)

// DefaultNodePorts is the local cluster's --service-node-port-range unless
// Options.NodePorts says otherwise: room for the 3,000 node ports
// bench-service makes.
var DefaultNodePorts = utilnet.PortRange{Base: 20000, Size: 32767 - 20000 + 1}

// nodeSpec is the plan of node i (from 1).
func nodeSpec(i int) Node {
	return Node{
		Name:      fmt.Sprintf("node-%d", i),
		IP:        fmt.Sprintf("10.0.0.%d", i),
		IPv6:      fmt.Sprintf("fd00:10::%x", i),
		PodCIDR:   fmt.Sprintf("10.244.%d.0/24", i),
		PodCIDRv6: fmt.Sprintf("fd00:244:0:%x::/64", i),
	}
}

// buildNetwork makes the bridge, the router, the client and a host per
// node, with their addresses (both families) and routes.
func (c *Cluster) buildNetwork() error {
	c.progressf("building the network: %d node hosts, a router and a client", c.opts.Nodes)
	bits, _ := NodeCIDR.Mask.Size()
	bits6, _ := NodeCIDRv6.Mask.Size()
	onNodeNetwork := func(v4, v6 netip.Addr) []netip.Prefix {
		return []netip.Prefix{netip.PrefixFrom(v4, bits), netip.PrefixFrom(v6, bits6)}
	}
	net, err := network.New(HostControlPlane, onNodeNetwork(ControlPlaneIP, ControlPlaneIPv6)...)
	if err != nil {
		return err
	}
	c.Network = net
	router, err := net.AddHost(HostRouter, onNodeNetwork(RouterIP, RouterIPv6)...)
	if err != nil {
		return err
	}
	client, err := net.AddIsolatedHost(HostClient)
	if err != nil {
		return err
	}
	if err := net.Link(router, "eth1", []netip.Prefix{netip.PrefixFrom(routerClientSide, ClientCIDR.Bits()), netip.PrefixFrom(routerClientSidev6, ClientCIDRv6.Bits())},
		client, "eth0", []netip.Prefix{netip.PrefixFrom(ClientIP, ClientCIDR.Bits()), netip.PrefixFrom(ClientIPv6, ClientCIDRv6.Bits())}); err != nil {
		return err
	}
	c.ExternalClient, c.Router = client, router
	if err := addRoutes(client, route{defaultRoute, routerClientSide}, route{defaultRoutev6, routerClientSidev6}); err != nil {
		return err
	}
	if err := c.RouteVIPs(); err != nil {
		return err
	}
	if err := addRoutes(net.Root, route{ClientCIDR, RouterIP}, route{ClientCIDRv6, RouterIPv6}); err != nil {
		return err
	}
	for i := 1; i <= c.opts.Nodes; i++ {
		n := nodeSpec(i)
		h, err := net.AddHost(n.Name, onNodeNetwork(netip.MustParseAddr(n.IP), netip.MustParseAddr(n.IPv6))...)
		if err != nil {
			return err
		}
		// A real node's pods have interfaces of their own (its CNI
		// plugin's); a simulated node's pod servers bind their IPs on the
		// node.
		if !c.opts.RealKubelets {
			if err := makePodRangesLocal(h, n); err != nil {
				return err
			}
		}
		// The router is the node's gateway (to the client subnet and
		// beyond). A default route is also what lets the node's own
		// programs reach ClusterIPs: the kernel routes a packet before
		// kube-proxy's output rules translate its destination.
		if err := addRoutes(h, route{defaultRoute, RouterIP}, route{defaultRoutev6, RouterIPv6}); err != nil {
			return err
		}
		n.Host = h
		c.Nodes = append(c.Nodes, n)
	}
	// Pod ranges are routed to their nodes everywhere (as a host-gateway
	// CNI does), so pods, node ports and the control plane reach any pod.
	hosts := []*network.Host{net.Root, router}
	for _, n := range c.Nodes {
		hosts = append(hosts, n.Host)
	}
	for _, n := range c.Nodes {
		for _, h := range hosts {
			if h == n.Host {
				continue
			}
			if err := addRoutes(h,
				route{netip.MustParsePrefix(n.PodCIDR), netip.MustParseAddr(n.IP)},
				route{netip.MustParsePrefix(n.PodCIDRv6), netip.MustParseAddr(n.IPv6)}); err != nil {
				return err
			}
		}
	}
	return nil
}

// makePodRangesLocal makes every pod IP of the node local to its host: its
// simulated pods' servers bind them (they share the node's namespace). An
// IPv4 range on lo does that by itself; an IPv6 one needs a route of type
// local for the range, and binding an address that is local only by such a
// route needs ip_nonlocal_bind (ebb's own listeners set IPV6_FREEBIND and do
// not depend on it).
func makePodRangesLocal(h *network.Host, n Node) error {
	if err := h.AddAddress("lo", netip.MustParsePrefix(n.PodCIDR)); err != nil {
		return err
	}
	if err := h.AddLocalRoute(netip.MustParsePrefix(n.PodCIDRv6)); err != nil {
		return err
	}
	return h.SetSysctl("net/ipv6/ip_nonlocal_bind", "1")
}

// route is a destination and its gateway.
type route struct {
	dst netip.Prefix
	via netip.Addr
}

func addRoutes(h *network.Host, routes ...route) error {
	for _, r := range routes {
		if err := h.AddRoute(r.dst, r.via); err != nil {
			return err
		}
	}
	return nil
}

// RouteVIPs gives the router its static routes to the VIP pools through
// the host that serves the VIPs (the control-plane host, where ebb lb runs),
// until ebb announces them.
func (c *Cluster) RouteVIPs() error { return c.RouteVIPsVia(ControlPlaneIP, ControlPlaneIPv6) }

// RouteVIPsVia replaces the router's static routes to the VIP pools with
// ones through the given hosts (several of a family: ECMP), where ebb lb
// runs: VIPPrefix through the IPv4 addresses, VIPPrefixv6 through the IPv6
// ones. A family with no address keeps its route.
func (c *Cluster) RouteVIPsVia(via ...netip.Addr) error {
	var v4, v6 []netip.Addr
	for _, a := range via {
		if a.Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a)
		}
	}
	if len(v4) > 0 {
		if err := c.Router.AddRoute(VIPPrefix, v4...); err != nil {
			return err
		}
	}
	if len(v6) > 0 {
		return c.Router.AddRoute(VIPPrefixv6, v6...)
	}
	return nil
}

// DeleteVIPRoutes removes the router's static routes to both VIP pools
// (for tests where ebb announces them).
func (c *Cluster) DeleteVIPRoutes() error {
	if err := c.Router.DeleteRoute(VIPPrefix); err != nil {
		return err
	}
	return c.Router.DeleteRoute(VIPPrefixv6)
}

// startTaps watches the bridge for new connections from this host to each
// node's node ports (LastNewConnection).
func (c *Cluster) startTaps(ctx context.Context) error {
	c.taps = map[string]*network.SYNTap{}
	for _, n := range c.Nodes {
		t, err := c.Network.TapSYNs(ctx, netip.MustParseAddr(n.IP), uint16(c.opts.NodePorts.Base), uint16(c.opts.NodePorts.Base+c.opts.NodePorts.Size-1))
		if err != nil {
			return err
		}
		c.taps[n.Name] = t
	}
	return nil
}

// LastNewConnection is when a host other than the node itself (the
// control-plane host, where tests run ebb lb, or an LB node's host) last
// opened a TCP connection to the node on one of nodePorts (none: any node
// port; zero time: never): a load balancer in node mode sending the node
// new connections, seen even while the node is cut off. Name the Service's
// traffic ports: a Local Service's healthCheckNodePort is a node port too,
// and its probes would count. Connections other nodes' kube-proxies forward
// to the node's pods never count, nor those an LB on the node opens to
// itself.
func (c *Cluster) LastNewConnection(node string, nodePorts ...int32) time.Time {
	t, ok := c.taps[node]
	if !ok {
		return time.Time{}
	}
	ports := make([]uint16, 0, len(nodePorts))
	for _, p := range nodePorts {
		ports = append(ports, uint16(p))
	}
	return t.Last(ports...)
}

// Disconnect cuts a node's host off the node network, as if the machine
// vanished: connections to it and through it hang, its health checks time
// out, and nothing on it is told. The Node object stays as it was.
func (c *Cluster) Disconnect(node string) error { return c.Network.Disconnect(node) }

// Reconnect plugs a node's host back in.
func (c *Cluster) Reconnect(node string) error { return c.Network.Reconnect(node) }

// RouteVIPsOnLink replaces the router's static routes to both VIP pools
// with on-link ones out of its node-network interface: the router asks the
// segment who has each address (ARP, NDP), as for pools announced by L2.
func (c *Cluster) RouteVIPsOnLink() error {
	if err := c.DeleteVIPRoutes(); err != nil {
		return err
	}
	for _, p := range []netip.Prefix{VIPPrefix, VIPPrefixv6} {
		if err := c.Router.AddLinkRoute(p, "eth0"); err != nil {
			return err
		}
	}
	return nil
}
