package localcluster

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// The cluster's network (docs/local-cluster.md draws it):
//
//	client 10.1.0.2 ── 10.1.0.1 router 10.0.0.253 ──┐
//	                                                 ├─ bridge ebb-nodes (10.0.0.0/24)
//	control plane 10.0.0.254 (this process) ─────────┤
//	node-1 10.0.0.1 (pods 10.244.1.0/24 on lo) ──────┤
//	node-2 10.0.0.2 ...                       ───────┘
//
// Each box is a network namespace. The control-plane host is the namespace
// this process runs in (made by Reexec): the apiserver, etcd, the
// controllers, kwok, ebb's processes started by tests, and the tests
// themselves run there. Each node runs its own kube-proxy and its pods'
// servers. No VIP is configured on any host: ebb lb adds a local route for
// each VIP it serves (internal/vipaddr) where it runs, on the control-plane
// host for now, and the router has a static route to the VIP pool through
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

	routerClientSide = netip.MustParseAddr("10.1.0.1")
)

// Names of the hosts that are not nodes.
const (
	HostControlPlane = "control-plane"
	HostRouter       = "router"
	HostClient       = "client"
)

// nodePortRange is the apiserver's --service-node-port-range (room for the
// 3,000 node ports bench-service makes).
const (
	nodePortFirst = 20000
	nodePortLast  = 32767
)

// nodeSpec is the plan of node i (from 1).
func nodeSpec(i int) Node {
	return Node{
		Name:    fmt.Sprintf("node-%d", i),
		IP:      fmt.Sprintf("10.0.0.%d", i),
		PodCIDR: fmt.Sprintf("10.244.%d.0/24", i),
	}
}

// buildNetwork makes the bridge, the router, the client and a host per
// node, with their addresses and routes.
func (c *Cluster) buildNetwork() error {
	c.progressf("building the network: %d node hosts, a router and a client", c.opts.Nodes)
	bits, _ := NodeCIDR.Mask.Size()
	net, err := network.New(HostControlPlane, netip.PrefixFrom(ControlPlaneIP, bits))
	if err != nil {
		return err
	}
	c.Network = net
	router, err := net.AddHost(HostRouter, netip.PrefixFrom(RouterIP, bits))
	if err != nil {
		return err
	}
	client, err := net.AddIsolatedHost(HostClient)
	if err != nil {
		return err
	}
	if err := net.Link(router, "eth1", []netip.Prefix{netip.PrefixFrom(routerClientSide, ClientCIDR.Bits())},
		client, "eth0", []netip.Prefix{netip.PrefixFrom(ClientIP, ClientCIDR.Bits())}); err != nil {
		return err
	}
	c.ExternalClient, c.Router = client, router
	if err := client.AddRoute(netip.MustParsePrefix("0.0.0.0/0"), routerClientSide); err != nil {
		return err
	}
	if err := c.RouteVIPs(); err != nil {
		return err
	}
	if err := net.Root.AddRoute(ClientCIDR, RouterIP); err != nil {
		return err
	}
	for i := 1; i <= c.opts.Nodes; i++ {
		n := nodeSpec(i)
		h, err := net.AddHost(n.Name, netip.PrefixFrom(netip.MustParseAddr(n.IP), bits))
		if err != nil {
			return err
		}
		// Every pod IP of the node is local to it: its pods' servers bind
		// them (pods of the simulation share the node's namespace).
		if err := h.AddAddress("lo", netip.MustParsePrefix(n.PodCIDR)); err != nil {
			return err
		}
		// The router is the node's gateway (to the client subnet and
		// beyond). A default route is also what lets the node's own
		// programs reach ClusterIPs: the kernel routes a packet before
		// kube-proxy's output rules translate its destination.
		if err := h.AddRoute(netip.MustParsePrefix("0.0.0.0/0"), RouterIP); err != nil {
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
			if err := h.AddRoute(netip.MustParsePrefix(n.PodCIDR), netip.MustParseAddr(n.IP)); err != nil {
				return err
			}
		}
	}
	return nil
}

// RouteVIPs gives the router its static route to the VIP pool through the
// host that serves the VIPs (the control-plane host, where ebb lb runs),
// until ebb announces them.
func (c *Cluster) RouteVIPs() error { return c.RouteVIPsVia(ControlPlaneIP) }

// RouteVIPsVia replaces the router's static route to the VIP pool with one
// through the given hosts (several: ECMP), where ebb lb runs.
func (c *Cluster) RouteVIPsVia(via ...netip.Addr) error {
	return c.Router.AddRoute(VIPPrefix, via...)
}

// startTaps watches the bridge for new connections from this host to each
// node's node ports (LastNewConnection).
func (c *Cluster) startTaps(ctx context.Context) error {
	c.taps = map[string]*network.SYNTap{}
	for _, n := range c.Nodes {
		t, err := c.Network.TapSYNs(ctx, netip.MustParseAddr(n.IP), nodePortFirst, nodePortLast)
		if err != nil {
			return err
		}
		c.taps[n.Name] = t
	}
	return nil
}

// LastNewConnection is when the control-plane host (where tests run ebb
// lb) last opened a TCP connection to the node on one of nodePorts (none:
// any node port; zero time: never): a load balancer in node mode sending
// the node new connections, seen even while the node is cut off. Name the
// Service's traffic ports: a Local Service's healthCheckNodePort is a node
// port too, and its probes would count. Connections other nodes'
// kube-proxies forward to the node's pods never count.
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
