package dataplane

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	vnetlink "github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
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

// DefaultKernelTable names the nftables tables (families ip and ip6) the
// kernel engine owns.
const DefaultKernelTable = "ebb"

// kernelUnsupported says why a frontend cannot be served by the kernel
// engine, or "" if it can.
func kernelUnsupported(f *Frontend) string {
	switch {
	case f.ProxyProtocol:
		return "proxyProtocol needs the proxy engine (the kernel forwards packets; it writes no header)"
	case f.Balancing == LeastConnections:
		return "LeastConnections balancing needs the proxy engine (the kernel keeps no per-backend connection count to choose by)"
	}
	v4 := f.key().addr.Addr().Is4()
	for _, b := range f.Backends {
		if b.AddrPort().Addr().Unmap().Is4() != v4 {
			return "backends of the other address family than the frontend's need the proxy engine (the kernel translates addresses within a family)"
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
	// reused deletes the stale flows of reused client ports once the
	// tables are installed (kernel_reused.go).
	reused reusedPorts
	// slotState is what the kernel's tables hold (nil installed when
	// unknown).
	slotState
}

// installedFrontend is what the tables hold for a frontend: the backend
// set its rules were built from, its table and index there, its backends'
// eligibility they were planned by, and its slots.
type installedFrontend struct {
	set    *backendSet
	family nftables.TableFamily
	index  int
	elig   setEligibility
	plan   slotPlan
}

func newKernelEngine(table string, netns int, log logr.Logger) *kernelEngine {
	if table == "" {
		table = DefaultKernelTable
	}
	return &kernelEngine{table: table, netns: netns, reused: reusedPorts{netns: netns, log: log, retry: reusedPortRetry}}
}

// reusedPortRetry is how often a reader of reused ports' SYNs tries to
// bind the nflog group another process holds (the ebb lb it takes over
// from): well inside a client's first SYN retransmission (1 s).
const reusedPortRetry = 200 * time.Millisecond

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
		return fmt.Errorf("setting the nftables socket's buffers: %w", serr)
	}
	return nil
}

// sync installs the rules of frontends, IPv4 ones in the table of family
// ip, IPv6 ones in ip6. When the frontends and their backend sets are those
// installed, only the map entries that changed are rewritten (the
// admin-state and probe path: for a node that starts or stops leaving,
// usually one entry of the owners map); otherwise both tables are rebuilt.
// Either is one nftables transaction: all of it applies or nothing does.
// Flows already established keep their translation in conntrack whatever
// the rules say; only new flows follow the new rules. Without prepare,
// the entries prepared for owners' next changes are left as they are (the
// fast path), and stale says whether a later sync with prepare should
// bring them up to date (an eligibility changed since they were).
func (k *kernelEngine) sync(frontends []*frontend, m *metrics, prepare bool) (stale bool, err error) {
	start := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	c, err := k.connect()
	if err != nil {
		return false, err
	}
	want, owners := k.places(frontends)
	same, stale, prepared := k.planAll(want, owners, prepare)
	rulesets := map[nftables.TableFamily]*kernelRuleset{}
	for _, a := range []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()} {
		fam := familyOf(a)
		rulesets[fam.table] = &kernelRuleset{fam: fam, table: &nftables.Table{Name: k.table, Family: fam.table}, conn: c, pending: map[*nftables.Set][]nftables.SetElement{}, reused: k.reused.supported()}
	}
	kind := "rebuild"
	if same {
		kind, err = k.updateMaps(rulesets, want, owners)
	} else {
		err = rebuild(rulesets, frontends, want, owners)
	}
	if err == nil {
		err = c.Flush()
	}
	if err != nil {
		m.kernelFailures.Inc()
		k.forget()
		return false, fmt.Errorf("installing the nftables tables %s: %w", k.table, err)
	}
	m.kernelSyncs.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	k.record(want, owners, prepared)
	if k.reused.supported() {
		k.reused.start(m.kernelReused.Inc)
	}
	return stale, nil
}

// eligibilityChanged reports whether a backend's eligibility differs from
// the one the installed entries were planned by.
func (k *slotState) eligibilityChanged(want map[*frontend]installedFrontend) bool {
	for f, w := range want {
		have := k.installed[f].elig
		if !slices.Equal(have.now, w.elig.now) || !slices.Equal(have.back, w.elig.back) {
			return true
		}
	}
	return false
}

// places computes where the tables hold frontends (their table and
// index there, their backend sets and eligibility) and each table's
// owners; planAll then plans their slots.
func (k *kernelEngine) places(frontends []*frontend) (want map[*frontend]installedFrontend, owners map[nftables.TableFamily]ownerTable) {
	slices.SortFunc(frontends, compareNames)
	want = make(map[*frontend]installedFrontend, len(frontends))
	sets := map[nftables.TableFamily][]*backendSet{}
	index := map[nftables.TableFamily]int{}
	for _, f := range frontends {
		set := f.set.Load()
		fam := familyOf(f.key.addr.Addr()).table
		want[f] = installedFrontend{set: set, family: fam, index: index[fam], elig: eligibilityOf(set)}
		sets[fam] = append(sets[fam], set)
		index[fam]++
	}
	owners = map[nftables.TableFamily]ownerTable{}
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		owners[fam] = newOwnerTable(sets[fam])
	}
	return want, owners
}

// planAll plans the slots of want (placed, with their owners) and says
// how they relate to the installed ones: same, the structure is the
// installed one (then each frontend's installed plan is its previous
// one); stale, without prepare, an eligibility changed since the
// prepared entries were made, so a sync with prepare should follow;
// prepared, the planned entries are prepared for every owner's next
// change.
func (s *slotState) planAll(want map[*frontend]installedFrontend, owners map[nftables.TableFamily]ownerTable, prepare bool) (same, stale, prepared bool) {
	same = s.sameStructure(want)
	prepared = true
	if same {
		stale = !prepare && s.eligibilityChanged(want)
		prepared = prepare || (s.preparedAll && !stale)
	}
	for f, w := range want {
		var prev *slotPlan
		if same {
			have := s.installed[f].plan
			prev = &have
		}
		w.plan = planSlots(w.set, owners[w.family], w.elig, prev, prepare)
		want[f] = w
	}
	return same, stale, prepared
}

// record records want and owners as installed, and each backend's
// eligibility in them as what the kernel does with new flows.
func (s *slotState) record(want map[*frontend]installedFrontend, owners map[nftables.TableFamily]ownerTable, prepared bool) {
	s.installed, s.owners, s.preparedAll, s.preparedOwner = want, owners, prepared, ""
	for _, w := range want {
		for j, b := range w.set.backends {
			b.inKernel.Store(w.elig.now[j])
		}
	}
}

// compareNames orders frontends by name: both kernel paths place them in
// that order.
func compareNames(a, b *frontend) int {
	return strings.Compare(a.set.Load().cfg.Name, b.set.Load().cfg.Name)
}

// sameStructure reports whether the frontends, their backend sets and
// their places in the tables are the ones installed.
func (k *slotState) sameStructure(want map[*frontend]installedFrontend) bool {
	if k.installed == nil || len(k.installed) != len(want) {
		return false
	}
	for f, w := range want {
		if have, ok := k.installed[f]; !ok || have.set != w.set || have.family != w.family || have.index != w.index {
			return false
		}
	}
	return true
}

// rebuild replaces both tables.
func rebuild(rulesets map[nftables.TableFamily]*kernelRuleset, frontends []*frontend, want map[*frontend]installedFrontend, owners map[nftables.TableFamily]ownerTable) error {
	for fam, r := range rulesets {
		// Add, delete, add: the table is replaced whether or not it
		// existed (adding an existing table is no error; deleting a
		// missing one is).
		r.conn.AddTable(r.table)
		r.conn.DelTable(r.table)
		r.conn.AddTable(r.table)
		if err := r.addBase(); err != nil {
			return err
		}
		r.addOwners(owners[fam])
	}
	for _, f := range frontends {
		w := want[f]
		if err := rulesets[w.family].addFrontend(w.index, w.set, &w.plan); err != nil {
			return err
		}
	}
	for _, r := range rulesets {
		if err := r.flushPending(); err != nil {
			return err
		}
	}
	return nil
}

// updateMaps rewrites the map entries that changed since the maps were
// installed: per table, one message of deletions and one of additions for
// every frontend at once (up to a thousand entries each), for the owners
// map and the backends map. It says which kind of update it was: "owners"
// when only owners' states changed (the admin-state fast path), else
// "entries".
func (k *kernelEngine) updateMaps(rulesets map[nftables.TableFamily]*kernelRuleset, want map[*frontend]installedFrontend, owners map[nftables.TableFamily]ownerTable) (string, error) {
	// The admin-state fast path runs this on every node's taint: the
	// entries are appended in place, not gathered per frontend, since
	// allocation (and the collections it brings) was half its time.
	gone := map[nftables.TableFamily][]nftables.SetElement{}
	added := map[nftables.TableFamily][]nftables.SetElement{}
	for f, w := range want {
		have := k.installed[f].plan
		gone[w.family], added[w.family] = changedSlots(gone[w.family], added[w.family], w.index, w.set, &have, &w.plan)
	}
	kind := "owners"
	for fam, r := range rulesets {
		// A slot's home changes only with the structure: homes stays.
		_, ownersMap, backends := kernelMaps(r.table, r.fam)
		ownersGone, ownersAdded := changedOwners(k.owners[fam], owners[fam])
		for _, step := range []struct {
			m     *nftables.Set
			elems []nftables.SetElement
			add   bool
		}{
			// Deletions first, each map's, then additions: an entry
			// replaced is deleted and added in the one transaction.
			{ownersMap, ownersGone, false}, {backends, gone[fam], false},
			{ownersMap, ownersAdded, true}, {backends, added[fam], true},
		} {
			err := inChunks(step.elems, func(e []nftables.SetElement) error {
				if step.add {
					return r.conn.SetAddElements(step.m, e)
				}
				return r.conn.SetDeleteElements(step.m, e)
			})
			if err != nil {
				return "", fmt.Errorf("%s map: %w", step.m.Name, err)
			}
		}
		if len(gone[fam])+len(added[fam]) > 0 {
			kind = "entries"
		}
	}
	return kind, nil
}

// remove deletes both tables: new flows are no longer translated (flows
// already translated keep going as long as the host's NAT hooks run).
func (k *kernelEngine) remove() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	c, err := k.connect()
	if err != nil {
		return err
	}
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		t := &nftables.Table{Name: k.table, Family: fam}
		c.AddTable(t)
		c.DelTable(t)
	}
	err = c.Flush()
	k.forget()
	k.reused.close()
	if err != nil {
		return fmt.Errorf("removing the nftables tables %s: %w", k.table, err)
	}
	return nil
}

// hasState reports whether either of the engine's tables exists.
func (k *kernelEngine) hasState() (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c, err := k.connect()
	if err != nil {
		return false, err
	}
	tables, err := c.ListTables()
	if err != nil {
		return false, fmt.Errorf("listing nftables tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == k.table && (t.Family == nftables.TableFamilyIPv4 || t.Family == nftables.TableFamilyIPv6) {
			return true, nil
		}
	}
	return false, nil
}

// close lets go of the nftables socket and leaves the table as it is.
func (k *kernelEngine) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dropConn()
	k.reused.close()
}

// forget drops the connection, with anything batched on it, and what the
// tables were known to hold: the next sync rebuilds them.
func (k *kernelEngine) forget() {
	k.dropConn()
	k.installed, k.owners = nil, nil
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
	h, err := k.netlinkHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	_, err = h.ConntrackDeleteFilters(vnetlink.ConntrackTable, inetFamily(fe.addr.Addr()), flowFilter{frontend: fe, label: flowLabelOf(backend), backend: backend})
	if err != nil {
		return fmt.Errorf("deleting the conntrack entries of %s's flows to %s: %w", fe, backend, err)
	}
	return nil
}

func inetFamily(a netip.Addr) vnetlink.InetFamily {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// flowKey names the flows of one backend of one frontend.
type flowKey struct {
	frontend frontendKey
	backend  netip.AddrPort
}

// activeFlows counts the flows the kernel carries for the wanted frontends
// and backends: TCP connections until they close (TIME_WAIT and CLOSE are
// over), UDP flows until conntrack forgets them.
func (k *kernelEngine) activeFlows(want map[flowKey]flowLabel) (map[flowKey]int64, error) {
	h, err := k.netlinkHandle()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	var flows []*vnetlink.ConntrackFlow
	for _, family := range []vnetlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		fs, err := h.ConntrackTableList(vnetlink.ConntrackTable, family)
		if err != nil {
			return nil, fmt.Errorf("listing conntrack entries: %w", err)
		}
		flows = append(flows, fs...)
	}
	backends := make(map[flowLabel]netip.AddrPort, len(want))
	for key, label := range want {
		backends[label] = key.backend
	}
	out := map[flowKey]int64{}
	for _, f := range flows {
		// TIME_WAIT, CLOSE and the states after them are over.
		if tcp, ok := f.ProtoInfo.(*vnetlink.ProtoInfoTCP); ok && tcp.State >= nl.TCP_CONNTRACK_TIME_WAIT {
			continue
		}
		fe, ok := frontendOf(f)
		if !ok {
			continue
		}
		key := flowKey{frontend: fe, backend: replySource(f)}
		if label, ok := labelOf(f); ok {
			key.backend = backends[label]
		}
		if _, wanted := want[key]; wanted {
			out[key]++
		}
	}
	return out, nil
}

// flowLabel is the conntrack label the kernel engine's pick rule gives a
// flow: ebb's marker, then 15 bytes of the SHA-256 of the backend's
// address (16 bytes) and port. It
// says which backend a flow went to when the entry's reply tuple cannot:
// kube-proxy translated a flow to this host's node port on to a pod, and
// the reply comes from the pod.
type flowLabel [16]byte

// flowLabelMarker is a flow label's first byte: the bind chains translate
// only flows so labelled.
const flowLabelMarker = 0xeb

// flowLabelOf is the label of the flows to backend b.
func flowLabelOf(b netip.AddrPort) flowLabel {
	a := b.Addr().Unmap().As16()
	sum := sha256.Sum256(append(a[:], byte(b.Port()>>8), byte(b.Port())))
	var l flowLabel
	l[0] = flowLabelMarker
	copy(l[1:], sum[:])
	return l
}

// labelOf is the flow label of a conntrack entry, if the kernel engine
// gave it one (flows it translated before labels existed have none).
func labelOf(f *vnetlink.ConntrackFlow) (flowLabel, bool) {
	var l flowLabel
	if len(f.Labels) != len(l) || f.Labels[0] != flowLabelMarker {
		return l, false
	}
	copy(l[:], f.Labels)
	return l, true
}

// frontendOf is the frontend a conntrack entry was sent to (ok is false
// for protocols no frontend serves).
func frontendOf(f *vnetlink.ConntrackFlow) (frontendKey, bool) {
	proto := TCP
	switch f.Forward.Protocol {
	case unix.IPPROTO_TCP:
	case unix.IPPROTO_UDP:
		proto = UDP
	default:
		return frontendKey{}, false
	}
	dst, _ := netip.AddrFromSlice(f.Forward.DstIP)
	return frontendKey{addr: netip.AddrPortFrom(dst.Unmap(), f.Forward.DstPort), protocol: proto}, true
}

// replySource is where a conntrack entry's replies come from: the
// backend, for a flow the kernel engine translated itself.
func replySource(f *vnetlink.ConntrackFlow) netip.AddrPort {
	src, _ := netip.AddrFromSlice(f.Reverse.SrcIP)
	return netip.AddrPortFrom(src.Unmap(), f.Reverse.SrcPort)
}

// flowFilter is a conntrack filter that matches the entries of one
// frontend's flows to one backend: by their label, or for a flow with
// none, by the source of its replies.
type flowFilter struct {
	frontend frontendKey
	label    flowLabel
	backend  netip.AddrPort
}

func (ff flowFilter) MatchConntrackFlow(f *vnetlink.ConntrackFlow) bool {
	if fe, ok := frontendOf(f); !ok || fe != ff.frontend {
		return false
	}
	if label, ok := labelOf(f); ok {
		return label == ff.label
	}
	return replySource(f) == ff.backend
}

// netlinkHandle opens netlink in the engine's network namespace.
func (k *kernelEngine) netlinkHandle() (*vnetlink.Handle, error) {
	var h *vnetlink.Handle
	var err error
	if k.netns != 0 {
		h, err = vnetlink.NewHandleAt(netns.NsHandle(k.netns))
	} else {
		h, err = vnetlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("opening netlink: %w", err)
	}
	return h, nil
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
