package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	vnetlink "github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Engine says what serves a frontend's traffic.
type Engine string

const (
	// EngineProxy is the user-space proxy: every feature, a socket per
	// frontend, two connections per client connection.
	EngineProxy Engine = "Proxy"
	// EngineKernel forwards flows in the kernel: nftables DNAT to a
	// backend chosen per new flow, masquerade, conntrack carrying the
	// established flows. No user-space work per connection or packet.
	EngineKernel Engine = "Kernel"
	// EngineAuto is the kernel engine for a frontend that needs nothing
	// only the proxy can do, else the proxy.
	EngineAuto Engine = "Auto"
)

// DefaultKernelTable is the nftables table (family ip) the kernel engine
// owns.
const DefaultKernelTable = "ebb"

// kernelUnsupported says why a frontend cannot be served by the kernel
// engine, or "" if it can.
func kernelUnsupported(f *Frontend) string {
	switch {
	case f.ProxyProtocol:
		return "proxyProtocol needs the proxy engine (the kernel forwards packets; it writes no header)"
	case f.Balancing == LeastConnections:
		return "LeastConnections balancing needs the proxy engine (the kernel keeps no per-backend connection count to choose by)"
	case f.Balancing == ClientIP:
		return "ClientIP balancing is not implemented in the kernel engine yet: use the proxy engine"
	case f.key().addr.Addr().Is6():
		return "IPv6 frontends are not implemented in the kernel engine yet: use the proxy engine"
	}
	for _, b := range f.Backends {
		if b.AddrPort().Addr().Is6() {
			return "IPv6 backends are not implemented in the kernel engine yet: use the proxy engine"
		}
	}
	return ""
}

// kernelEngine installs the kernel engine's nftables table.
type kernelEngine struct {
	table string
	netns int // network namespace file descriptor; 0: this process's

	mu   sync.Mutex // one transaction at a time
	conn *nftables.Conn
	// installed is what the kernel's table holds: each kernel frontend
	// and the backend set its rules were built from; nil when unknown.
	installed map[*frontend]installedFrontend
}

// installedFrontend is what the table holds for a frontend: the backend
// set its rules were built from, and the backend of each map slot.
type installedFrontend struct {
	set   *backendSet
	slots []int
}

func newKernelEngine(table string, netns int) *kernelEngine {
	if table == "" {
		table = DefaultKernelTable
	}
	return &kernelEngine{table: table, netns: netns}
}

func (k *kernelEngine) connect() (*nftables.Conn, error) {
	if k.conn != nil {
		return k.conn, nil
	}
	opts := []nftables.ConnOption{nftables.AsLasting(), nftables.WithSockOptions(ackBuffer)}
	if k.netns != 0 {
		opts = append(opts, nftables.WithNetNSFd(k.netns))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("opening nftables: %w", err)
	}
	k.conn = c
	return c, nil
}

// ackBufferBytes is the send and receive buffer of the nftables socket. A
// transaction is sent in one message (a table for 50 frontends of 10
// backends is over a megabyte), and the kernel acknowledges each of its
// over a thousand parts: with the default buffers (net.core.wmem_max,
// rmem_max) the send fails (EMSGSIZE), or the acknowledgements overflow
// (ENOBUFS) and the outcome of the transaction is unknown.
const ackBufferBytes = 32 << 20

// ackBuffer raises the socket's buffers past the maximums
// (SO_RCVBUFFORCE, SO_SNDBUFFORCE, which need CAP_NET_ADMIN, as nftables
// does), or as far as the maximums allow without it.
func ackBuffer(c *netlink.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		for _, opt := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt[0], ackBufferBytes); serr != nil {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt[1], ackBufferBytes)
			}
			if serr != nil {
				return
			}
		}
	})
	if err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("setting the nftables socket's receive buffer: %w", serr)
	}
	return nil
}

// sync installs the rules of frontends. When the frontends and their
// backend sets are those installed, only the backends map entries whose
// backend changed are rewritten (the admin-state and probe path: two
// messages for up to a thousand entries); otherwise the whole table is. Each
// is one nftables transaction: either all of it applies or nothing does.
// Flows already established keep their translation in conntrack whatever
// the rules say; only new flows follow the new rules.
func (k *kernelEngine) sync(frontends []*frontend) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	c, err := k.connect()
	if err != nil {
		return err
	}
	slices.SortFunc(frontends, func(a, b *frontend) int {
		return strings.Compare(a.set.Load().cfg.Name, b.set.Load().cfg.Name)
	})
	t := &nftables.Table{Name: k.table, Family: nftables.TableFamilyIPv4}
	r := &kernelRuleset{table: t, conn: c, eligible: map[*backend]bool{}}
	for _, f := range frontends {
		for _, b := range f.set.Load().backends {
			r.eligible[b] = b.eligible()
		}
	}
	slots := make(map[*frontend][]int, len(frontends))
	for _, f := range frontends {
		set := f.set.Load()
		slots[f] = assignSlots(set, r.eligible, slotCount(set))
	}
	if k.sameStructure(frontends) {
		err = k.updateMaps(r, frontends, slots)
	} else {
		err = k.rebuild(r, frontends, slots)
	}
	if err == nil {
		err = c.Flush()
	}
	if err != nil {
		k.dropConn()
		k.installed = nil
		return fmt.Errorf("installing the nftables table %s: %w", k.table, err)
	}
	k.installed = map[*frontend]installedFrontend{}
	for _, f := range frontends {
		set := f.set.Load()
		k.installed[f] = installedFrontend{set: set, slots: slots[f]}
		for _, b := range set.backends {
			b.inKernel.Store(r.eligible[b])
		}
	}
	return nil
}

// sameStructure reports whether frontends and their backend sets are the
// ones installed.
func (k *kernelEngine) sameStructure(frontends []*frontend) bool {
	if k.installed == nil || len(k.installed) != len(frontends) {
		return false
	}
	for _, f := range frontends {
		if k.installed[f].set != f.set.Load() {
			return false
		}
	}
	return true
}

// rebuild replaces the whole table.
func (k *kernelEngine) rebuild(r *kernelRuleset, frontends []*frontend, slots map[*frontend][]int) error {
	// Add, delete, add: the table is replaced whether or not it existed
	// (adding an existing table is no error; deleting a missing one is).
	r.conn.AddTable(r.table)
	r.conn.DelTable(r.table)
	r.conn.AddTable(r.table)
	if err := r.addBase(); err != nil {
		return err
	}
	for i, f := range frontends {
		if err := r.addFrontend(i, f.set.Load(), slots[f]); err != nil {
			return err
		}
	}
	return r.flushPending()
}

// updateMaps rewrites the backends map entries that changed since the
// map was installed: one message of deletions, one of additions, for every
// frontend at once.
func (k *kernelEngine) updateMaps(r *kernelRuleset, frontends []*frontend, slots map[*frontend][]int) error {
	var gone, added []nftables.SetElement
	for i, f := range frontends {
		g, a := changedSlots(i, f.set.Load(), k.installed[f].slots, slots[f])
		gone, added = append(gone, g...), append(added, a...)
	}
	m := backendsMap(r.table)
	if err := inChunks(gone, func(e []nftables.SetElement) error { return r.conn.SetDeleteElements(m, e) }); err != nil {
		return fmt.Errorf("backends map: %w", err)
	}
	if err := inChunks(added, func(e []nftables.SetElement) error { return r.conn.SetAddElements(m, e) }); err != nil {
		return fmt.Errorf("backends map: %w", err)
	}
	return nil
}

// remove deletes the table: new flows are no longer translated (flows
// already translated keep going as long as the host's NAT hooks run).
func (k *kernelEngine) remove() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	c, err := k.connect()
	if err != nil {
		return err
	}
	t := &nftables.Table{Name: k.table, Family: nftables.TableFamilyIPv4}
	c.AddTable(t)
	c.DelTable(t)
	err = c.Flush()
	k.dropConn()
	k.installed = nil
	if err != nil {
		return fmt.Errorf("removing the nftables table %s: %w", k.table, err)
	}
	return nil
}

// close lets go of the nftables socket and leaves the table as it is.
func (k *kernelEngine) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dropConn()
}

func (k *kernelEngine) dropConn() {
	if k.conn != nil {
		_ = k.conn.CloseLasting()
		k.conn = nil
	}
}

// dropFlows deletes the conntrack entries of the flows the frontend k
// translated to backend: they end (a drain timeout ran out).
func (k *kernelEngine) dropFlows(fe frontendKey, backend netip.AddrPort) error {
	h, err := vnetlink.NewHandle()
	if k.netns != 0 {
		h, err = vnetlink.NewHandleAt(netns.NsHandle(k.netns))
	}
	if err != nil {
		return fmt.Errorf("opening netlink: %w", err)
	}
	defer h.Close()
	_, err = h.ConntrackDeleteFilters(vnetlink.ConntrackTable, unix.AF_INET, translatedTo{frontend: fe, backend: backend})
	if err != nil {
		return fmt.Errorf("deleting the conntrack entries of %s's flows to %s: %w", fe, backend, err)
	}
	return nil
}

// flowKey names the flows of one backend of one frontend.
type flowKey struct {
	frontend frontendKey
	backend  netip.AddrPort
}

// activeFlows counts the flows the kernel carries for the kernel
// frontends, by frontend and backend: TCP connections until they close
// (TIME_WAIT and CLOSE are over), UDP flows until conntrack forgets them.
func (k *kernelEngine) activeFlows(frontends map[frontendKey]bool) (map[flowKey]int64, error) {
	h, err := vnetlink.NewHandle()
	if k.netns != 0 {
		h, err = vnetlink.NewHandleAt(netns.NsHandle(k.netns))
	}
	if err != nil {
		return nil, fmt.Errorf("opening netlink: %w", err)
	}
	defer h.Close()
	flows, err := h.ConntrackTableList(vnetlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		return nil, fmt.Errorf("listing conntrack entries: %w", err)
	}
	out := map[flowKey]int64{}
	for _, f := range flows {
		proto := TCP
		switch f.Forward.Protocol {
		case unix.IPPROTO_TCP:
			if tcp, ok := f.ProtoInfo.(*vnetlink.ProtoInfoTCP); ok && tcp.State >= tcpConntrackTimeWait {
				continue
			}
		case unix.IPPROTO_UDP:
			proto = UDP
		default:
			continue
		}
		dst, _ := netip.AddrFromSlice(f.Forward.DstIP)
		src, _ := netip.AddrFromSlice(f.Reverse.SrcIP)
		fe := frontendKey{addr: netip.AddrPortFrom(dst.Unmap(), f.Forward.DstPort), protocol: proto}
		if frontends[fe] {
			out[flowKey{frontend: fe, backend: netip.AddrPortFrom(src.Unmap(), f.Reverse.SrcPort)}]++
		}
	}
	return out, nil
}

// tcpConntrackTimeWait is TCP_CONNTRACK_TIME_WAIT; CLOSE and the states
// after it are over too.
const tcpConntrackTimeWait = 7

// translatedTo matches the conntrack entries of flows that a frontend's
// rules translated to one backend: sent to the frontend's address and
// port, answered by the backend's.
type translatedTo struct {
	frontend frontendKey
	backend  netip.AddrPort
}

func (m translatedTo) MatchConntrackFlow(f *vnetlink.ConntrackFlow) bool {
	proto := uint8(unix.IPPROTO_TCP)
	if m.frontend.protocol == UDP {
		proto = unix.IPPROTO_UDP
	}
	fwd, rev := f.Forward, f.Reverse
	return fwd.Protocol == proto &&
		fwd.DstIP.Equal(m.frontend.addr.Addr().AsSlice()) && fwd.DstPort == m.frontend.addr.Port() &&
		rev.SrcIP.Equal(m.backend.Addr().AsSlice()) && rev.SrcPort == m.backend.Port()
}

// CheckForwarding reports what keeps flows from other hosts from being
// forwarded: the kernel engine translates them, then routes them out.
func CheckForwarding() error {
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(data)) != "1" {
		return errors.New("net.ipv4.ip_forward is 0: flows from other hosts to kernel-engine frontends will not be forwarded (set it to 1)")
	}
	return nil
}
