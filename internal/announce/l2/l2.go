// Package l2 announces load-balancer addresses on a layer-2 segment: for
// each address, exactly one ready replica owns it, answers ARP (IPv4) and
// NDP neighbour solicitations (IPv6) for it on the chosen interfaces, and
// sends gratuitous ARP / unsolicited neighbour advertisements when it
// takes it over, so the segment's neighbours (the router) send the
// address's traffic to that host.
//
// Who owns what is decided without the API server and without a leader:
// each replica broadcasts a heartbeat on the segment several times a
// second (an Ethernet frame of its own EtherType, see heartbeat.go) with
// the addresses it offers, and every replica ranks, for each address, the
// live replicas offering it by a hash of (node, address) (owner.go). They
// all reach the same answer; a replica that falls silent for DeadAfter
// (its host died or left the segment) loses its addresses to the next in
// each ranking within that time, and one that stops offering an address
// (withdrawn, leaving, shutting down) gives it up at the next heartbeat.
// Leases in the API server were the other choice: they fail over in
// seconds, not a fraction of one, and a host cut off from the API server
// but not from the segment would lose addresses it can still serve.
package l2

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/ndp"
	"k8s.io/utils/clock"

	"github.com/ebbdev/ebb/internal/netnsexec"
)

// Config configures an Announcer.
type Config struct {
	// Group: replicas sharing addresses (the load-balancer class).
	Group string
	// Node names this replica's host; it must differ between hosts.
	Node string
	// Interfaces are where the addresses are announced (the segment the
	// router is on), e.g. eth0.
	Interfaces []string
	// Interval between heartbeats; defaults to 100 ms.
	Interval time.Duration
	// DeadAfter: a replica not heard for this long has lost its
	// addresses; defaults to 5 intervals. It bounds the failover time.
	DeadAfter time.Duration
	// KernelTable names the nftables table (family arp) that keeps the
	// kernel from answering ARP for the addresses; defaults to
	// DefaultKernelTable.
	KernelTable string
	// NetNS is the network namespace of the nftables table (a file
	// descriptor; 0: this process's). Sockets are opened in the calling
	// thread's namespace, and those opened later (an NDP responder once
	// its interface has a link-local address) in NetNS: set it when
	// starting the announcer from a thread in another namespace than the
	// process's.
	NetNS int
	// Clock defaults to the real one.
	Clock clock.WithTicker
}

// Announcer owns addresses on the segment for this replica.
type Announcer struct {
	cfg    Config
	log    logr.Logger
	ifaces []*iface
	karp   *kernelARP

	// mine is the set of addresses this replica owns now, read by the
	// responders without a lock.
	mine atomic.Pointer[map[netip.Addr]bool]
	// only limits addresses to some interfaces (Restrict); an address not
	// in it is announced on every one.
	only atomic.Pointer[map[netip.Addr]map[string]bool]

	// keys sign and check heartbeats; nil until SetKeys.
	keys atomic.Pointer[Keys]
	// accepted counts the peers' frames of this group that were not
	// refused.
	accepted atomic.Uint64
	// refused counts the frames refused, by reason (refusedReasons; the
	// map itself never changes).
	refused map[string]*atomic.Uint64

	mu      sync.Mutex
	members *members
	// seq numbers this process's frames (heartbeat.Seq).
	seq   uint64
	offer []netip.Addr
	gen   uint32
	// gratuitous counts the announcements still to send for each address
	// taken over (a few, in case one is lost).
	gratuitous map[netip.Addr]int
	// later holds, for each address taken over, when to announce it once
	// more (takeoverEchoes).
	later   map[netip.Addr][]time.Time
	started time.Time
	// incarnation tells this process apart from another of the same
	// node (heartbeat.Incarnation).
	incarnation uint64
	// live are the peers heard at the last election.
	live      map[string]bool
	takeovers atomic.Uint64

	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed bool
	// stopping tells the readers that their socket's error is the close.
	stopping atomic.Bool
	// localSet: SetLocal decides the kernel rules, not Sync.
	localSet bool
	// synced: Sync was called once; heartbeats go out from then on.
	synced bool
}

// takeoverEchoes are when, after a takeover and its first burst, the new
// owner announces the address once more: a neighbour that missed or
// ignored the burst (a lost frame, a busy router) is set right within
// seconds rather than when its entry goes stale and it asks again (seen
// in an e2e run: the router kept the dead owner's MAC for 6 s).
var takeoverEchoes = []time.Duration{time.Second, 2 * time.Second}

// gratuitousRepeats is how many gratuitous announcements follow a
// takeover, one per heartbeat.
const gratuitousRepeats = 3

// reannounceEvery is how often an owner announces its addresses again
// unasked: a neighbour that cached another replica's MAC for one (it asked
// while two replicas both owned it for a moment, or a gratuitous
// announcement was lost) is set right within this time.
const reannounceEvery = 10 * time.Second

// Start opens the interfaces and starts heartbeating. The replica owns
// nothing until it has listened for DeadAfter, so that a replica starting
// beside live ones does not first claim every address.
func Start(ctx context.Context, log logr.Logger, cfg Config) (*Announcer, error) {
	if cfg.Node == "" {
		return nil, errors.New("L2 announcement needs this host's node name")
	}
	if len(cfg.Interfaces) == 0 {
		return nil, errors.New("L2 announcement needs at least one interface")
	}
	if len(cfg.Group) > 255 || len(cfg.Node) > 255 {
		return nil, errors.New("L2 announcement: the group and node names must be at most 255 bytes")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 100 * time.Millisecond
	}
	if cfg.DeadAfter <= 0 {
		cfg.DeadAfter = 5 * cfg.Interval
	}
	if cfg.KernelTable == "" {
		cfg.KernelTable = DefaultKernelTable
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	a := &Announcer{cfg: cfg, log: log, members: newMembers(cfg.DeadAfter), refused: newRefusedCounts(), gratuitous: map[netip.Addr]int{}, later: map[netip.Addr][]time.Time{},
		karp: &kernelARP{table: cfg.KernelTable, netns: cfg.NetNS}}
	a.mine.Store(&map[netip.Addr]bool{})
	a.only.Store(&map[netip.Addr]map[string]bool{})
	for _, name := range cfg.Interfaces {
		ifc, err := a.openLocked(name)
		if err != nil {
			a.closeInterfaces()
			return nil, err
		}
		a.ifaces = append(a.ifaces, ifc)
	}
	a.karp.ifaces = kernelIfaces(a.ifaces)
	// The kernel rules are left as they are until the first Sync: a
	// predecessor's on this host keep the kernel quiet for the addresses
	// until then.
	ctx, a.cancel = context.WithCancel(ctx)
	a.started = cfg.Clock.Now()
	a.incarnation = uint64(time.Now().UnixNano())
	for _, ifc := range a.ifaces {
		a.serve(ifc)
	}
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.run(ctx) }()
	return a, nil
}

// openLocked opens an interface, logging what it cannot announce there.
func (a *Announcer) openLocked(name string) (*iface, error) {
	ifc, err := openInterface(name)
	if err != nil {
		return nil, err
	}
	if ifc.ndp.Load() == nil {
		a.log.Info("No NDP on this interface yet: IPv6 addresses are announced there once it has a usable link-local address", "interface", name, "reason", ifc.ndpErr.Error())
	}
	if !ifc.v4.IsValid() {
		a.log.Info("No IPv4 address on this interface: IPv4 addresses are not announced there", "interface", name)
	}
	return ifc, nil
}

// serve starts ifc's readers.
func (a *Announcer) serve(ifc *iface) {
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.readHeartbeats(ifc) }()
	if ifc.arp != nil {
		a.wg.Add(1)
		go func() { defer a.wg.Done(); a.answerARP(ifc) }()
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if ifc.ndp.Load() == nil && !a.awaitNDP(ifc) {
			return
		}
		a.answerNDP(ifc)
	}()
}

// awaitNDP opens the NDP responder of an interface that had no usable
// link-local address when it was opened, retrying until it has one (its
// duplicate address detection over, or an address added): then it joins
// the solicited-node groups of the IPv6 addresses this replica owns and
// announces them there. False if the interface or the announcer closed
// first.
func (a *Announcer) awaitNDP(ifc *iface) bool {
	for wait := ndpRetryFirst; ; wait = min(2*wait, ndpRetryMax) {
		a.cfg.Clock.Sleep(wait)
		if a.stopping.Load() || ifc.closed.Load() {
			return false
		}
		var c *ndp.Conn
		err := netnsexec.Run(a.cfg.NetNS, func() (err error) {
			c, err = listenNDP(ifc.ifi)
			return err
		})
		if errors.Is(err, errNoLinkLocal) {
			continue
		}
		if err != nil {
			a.log.Error(err, "Opening NDP", "interface", ifc.ifi.Name)
			return false
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.closed || ifc.closed.Load() {
			c.Close()
			return false
		}
		ifc.ndp.Store(c)
		for addr := range *a.mine.Load() {
			if addr.Is6() && a.allowedOn(addr, ifc) {
				if err := ifc.join(addr, true); err != nil {
					a.log.Error(err, "Joining a solicited-node multicast group", "address", addr, "interface", ifc.ifi.Name)
				}
				a.gratuitous[addr] = max(a.gratuitous[addr], gratuitousRepeats)
			}
		}
		a.announceLocked()
		a.log.Info("NDP on this interface: IPv6 addresses are announced there", "interface", ifc.ifi.Name)
		return true
	}
}

// How soon, and then how often at most, an interface without a usable
// link-local address is tried again (duplicate address detection takes
// about a second after the link comes up).
const (
	ndpRetryFirst = 100 * time.Millisecond
	ndpRetryMax   = 5 * time.Second
)

// kernelIfaces are the interfaces whose outgoing ARP the kernel rules
// rewrite: those with an IPv4 address.
func kernelIfaces(ifaces []*iface) []ifaceAddr {
	var out []ifaceAddr
	for _, ifc := range ifaces {
		if ifc.v4.IsValid() {
			out = append(out, ifaceAddr{index: ifc.ifi.Index, addr: ifc.v4})
		}
	}
	return out
}

// SetInterfaces announces on exactly names from now on: interfaces not
// open yet are opened (and told this replica's claims at once), the
// others closed. The election does not change. An interface that cannot
// be opened is left out and returned as an error; the others apply.
func (a *Announcer) SetInterfaces(names []string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var keep []*iface
	closed := false
	have := map[string]bool{}
	for _, ifc := range a.ifaces {
		if want[ifc.ifi.Name] {
			keep = append(keep, ifc)
			have[ifc.ifi.Name] = true
			continue
		}
		a.log.Info("No longer announcing on this interface", "interface", ifc.ifi.Name)
		ifc.close()
		closed = true
	}
	var errs []error
	var opened []*iface
	for _, n := range names {
		if have[n] {
			continue
		}
		have[n] = true
		ifc, err := a.openLocked(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		a.log.Info("Announcing on this interface", "interface", n)
		opened = append(opened, ifc)
		a.serve(ifc)
	}
	a.ifaces = append(keep, opened...)
	a.cfg.Interfaces = make([]string, 0, len(a.ifaces))
	for _, ifc := range a.ifaces {
		a.cfg.Interfaces = append(a.cfg.Interfaces, ifc.ifi.Name)
	}
	a.karp.ifaces = kernelIfaces(a.ifaces)
	if a.karp.synced && (closed || len(opened) > 0) {
		a.karp.synced = false // the rewrite rules follow the interfaces
		errs = append(errs, a.karp.sync(a.karp.last))
	}
	if len(opened) > 0 {
		for addr := range *a.mine.Load() {
			for _, ifc := range opened {
				if addr.Is6() {
					if err := ifc.join(addr, true); err != nil {
						a.log.Error(err, "Joining a solicited-node multicast group", "address", addr, "interface", ifc.ifi.Name)
					}
				}
			}
			a.gratuitous[addr] = max(a.gratuitous[addr], gratuitousRepeats)
		}
		a.heartbeatLocked()
		a.announceLocked()
	}
	return errors.Join(errs...)
}

// Sync offers exactly addrs (the addresses this replica serves and may
// announce; none while withdrawn). The replica owns the ones it ranks
// first for among the live replicas offering them.
func (a *Announcer) Sync(addrs []netip.Addr) error {
	offer := slices.Clone(addrs)
	slices.SortFunc(offer, netip.Addr.Compare)
	offer = slices.Compact(offer)
	if m := maxAddresses(a.cfg.Group, a.cfg.Node); len(offer) > m {
		return fmt.Errorf("L2 announcement of %d addresses: at most %d fit in the heartbeats", len(offer), m)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	var err error
	if !a.localSet {
		// No SetLocal: the offer is what is local.
		err = a.karp.sync(offer)
	}
	if !slices.Equal(offer, a.offer) || !a.synced {
		a.synced = true
		a.offer = offer
		a.gen++
		a.heartbeatLocked()
		a.electLocked(a.cfg.Clock.Now())
	}
	return err
}

// SetLocal says which addresses are local to this host (have a local
// route), offered or not: the kernel is kept from answering ARP for every
// one of them, also while they are not offered (withdrawn, stopping), when
// only the owner may answer. Call it before the addresses become local.
func (a *Announcer) SetLocal(addrs []netip.Addr) error {
	local := slices.Clone(addrs)
	slices.SortFunc(local, netip.Addr.Compare)
	local = slices.Compact(local)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.localSet = true
	return a.karp.sync(local)
}

// Repair writes the rules that keep the kernel from answering ARP for the
// addresses again if something else removed them (a firewall reload), and
// reports whether it had to.
func (a *Announcer) Repair() (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false, nil
	}
	return a.karp.repair()
}

// Owned returns the addresses this replica owns now.
func (a *Announcer) Owned() []netip.Addr {
	var out []netip.Addr
	for addr := range *a.mine.Load() {
		out = append(out, addr)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func (a *Announcer) owns(addr netip.Addr) bool { return (*a.mine.Load())[addr] }

// ownsOn says whether this replica answers for addr on ifc.
func (a *Announcer) ownsOn(addr netip.Addr, ifc *iface) bool {
	return a.owns(addr) && a.allowedOn(addr, ifc)
}

func (a *Announcer) allowedOn(addr netip.Addr, ifc *iface) bool {
	set, ok := (*a.only.Load())[addr]
	return !ok || set[ifc.ifi.Name]
}

// Interfaces are the interfaces the replica announces on.
func (a *Announcer) Interfaces() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.cfg.Interfaces)
}

// Restrict limits addresses to some of the interfaces (an address not in
// only: every interface); the election does not change, only where the
// owner answers and announces. Call it before the Sync that offers them.
func (a *Announcer) Restrict(only map[netip.Addr][]string) {
	m := make(map[netip.Addr]map[string]bool, len(only))
	for addr, names := range only {
		set := make(map[string]bool, len(names))
		for _, n := range names {
			set[n] = true
		}
		m[addr.Unmap()] = set
	}
	a.only.Store(&m)
}

// run heartbeats, forgets silent peers and elects, every interval.
func (a *Announcer) run(ctx context.Context) {
	t := a.cfg.Clock.NewTicker(a.cfg.Interval)
	defer t.Stop()
	lastReannounce := a.cfg.Clock.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C():
			a.mu.Lock()
			a.heartbeatLocked()
			a.electLocked(now)
			for addr, at := range a.later {
				if len(at) > 0 && !now.Before(at[0]) {
					a.gratuitous[addr] = max(a.gratuitous[addr], 1)
					at = at[1:]
				}
				if len(at) == 0 {
					delete(a.later, addr)
				} else {
					a.later[addr] = at
				}
			}
			if now.Sub(lastReannounce) >= reannounceEvery {
				lastReannounce = now
				for addr := range *a.mine.Load() {
					a.gratuitous[addr] = max(a.gratuitous[addr], 1)
				}
			}
			a.announceLocked()
			a.mu.Unlock()
		}
	}
}

// electLocked works out which addresses this replica owns now.
func (a *Announcer) electLocked(now time.Time) {
	live := a.members.live(now)
	// A peer that appears (a new replica, or one cut off until now, which
	// may believe it owns addresses) hears our claims again.
	joined := false
	names := make(map[string]bool, len(live))
	for node := range live {
		names[node] = true
		joined = joined || !a.live[node]
	}
	a.live = names
	var mine []netip.Addr
	// Without a key the replica has heard no one (every frame is refused
	// then), and once it has one it listens for DeadAfter again.
	if a.keys.Load() != nil && now.Sub(a.started) >= a.cfg.DeadAfter {
		mine = owned(a.cfg.Node, a.offer, live)
	}
	prev := *a.mine.Load()
	// An address another replica owned until now may still be cached at
	// its MAC by a neighbour that asked it meanwhile (two replicas briefly
	// both owned it, before they heard each other's offers): announce it
	// again once that one has let it go.
	released := a.members.takeReleased()
	next := make(map[netip.Addr]bool, len(mine))
	for _, addr := range mine {
		next[addr] = true
		if prev[addr] && released[addr] {
			a.gratuitous[addr] = gratuitousRepeats
		}
		if !prev[addr] {
			a.log.Info("Owning a load-balancer address on the segment", "address", addr, "peers", len(live))
			a.takeovers.Add(1)
			a.gratuitous[addr] = gratuitousRepeats
			a.later[addr] = nil
			for _, d := range takeoverEchoes {
				a.later[addr] = append(a.later[addr], now.Add(d))
			}
			a.joinLocked(addr, true)
		} else if joined {
			a.gratuitous[addr] = gratuitousRepeats
		}
	}
	for addr := range prev {
		if !next[addr] {
			a.log.Info("Leaving a load-balancer address to another replica", "address", addr, "peers", len(live))
			delete(a.gratuitous, addr)
			delete(a.later, addr)
			a.joinLocked(addr, false)
		}
	}
	a.mine.Store(&next)
	if !maps.Equal(prev, next) {
		// The others hear at once what this replica owns now.
		a.gen++
		a.heartbeatLocked()
	}
	a.announceLocked()
}

// announceLocked sends the gratuitous announcements still due, one round.
func (a *Announcer) announceLocked() {
	for addr, n := range a.gratuitous {
		for _, ifc := range a.ifaces {
			if !a.allowedOn(addr, ifc) {
				continue
			}
			if err := ifc.announce(addr); err != nil {
				a.log.V(1).Info("Gratuitous announcement failed", "address", addr, "interface", ifc.ifi.Name, "error", err.Error())
			}
		}
		if n <= 1 {
			delete(a.gratuitous, addr)
		} else {
			a.gratuitous[addr] = n - 1
		}
	}
}

// heartbeatLocked tells the segment this replica is alive, and its offer.
// Before its first Sync a process says nothing: a successor taking over
// a host's sockets must not speak for the node (with an empty offer) while
// its predecessor still serves.
func (a *Announcer) heartbeatLocked() {
	if !a.synced {
		return
	}
	keys := a.keys.Load()
	if keys == nil {
		return // no key yet: see SetKeys
	}
	for _, frame := range heartbeats(keys, a.cfg.Group, a.cfg.Node, a.incarnation, &a.seq, a.gen, a.offer, *a.mine.Load()) {
		for _, ifc := range a.ifaces {
			if err := ifc.broadcast(frame); err != nil {
				a.log.V(1).Info("Heartbeat failed", "interface", ifc.ifi.Name, "error", err.Error())
			}
		}
	}
}

// joinLocked joins (or leaves) the solicited-node multicast group of an
// IPv6 address on every interface, so its solicitations reach us.
func (a *Announcer) joinLocked(addr netip.Addr, join bool) {
	if !addr.Is6() {
		return
	}
	for _, ifc := range a.ifaces {
		if err := ifc.join(addr, join); err != nil {
			a.log.Error(err, "Changing a solicited-node multicast group", "address", addr, "interface", ifc.ifi.Name, "join", join)
		}
	}
}

// observe records a peer's heartbeat, or says why it refused it. It
// takes the members' lock only, never the announcer's: an election in
// progress does not hold up the readers.
func (a *Announcer) observe(h heartbeat) error {
	if h.Group != a.cfg.Group || h.Node == a.cfg.Node {
		return nil
	}
	fresh, err := a.members.observe(a.cfg.Clock.Now(), h)
	if fresh {
		a.accepted.Add(1)
	}
	return err
}

// refusedFrame counts a refused frame, and logs the first of each reason
// (a host on the segment may send any number).
func (a *Announcer) refusedFrame(ifc *iface, err error) {
	reason := refusedReason(err)
	if a.refused[reason].Add(1) == 1 {
		a.log.Info("Refusing a heartbeat frame on the segment (later ones for this reason are only counted in ebb_lb_l2_heartbeats_refused_total)", "interface", ifc.ifi.Name, "reason", reason, "error", err.Error())
	} else if v := a.log.V(4); v.Enabled() {
		v.Info("Refusing a heartbeat frame", "interface", ifc.ifi.Name, "reason", reason, "error", err.Error())
	}
}

// SetKeys sets the keys heartbeats are signed and checked with
// (ParseKeys). Until the first call the replica sends no heartbeat and
// accepts none, and so owns no address: an unauthenticated election would
// let any host on the segment take the addresses.
func (a *Announcer) SetKeys(k *Keys) {
	// Under the lock: an election must not see the first keys with the
	// start time from before them.
	a.mu.Lock()
	defer a.mu.Unlock()
	prev := a.keys.Swap(k)
	if prev == nil || prev.SigningID() != k.SigningID() || !slices.Equal(prev.Fingerprints(), k.Fingerprints()) {
		a.log.Info("Heartbeat keys", "signing", k.SigningID(), "accepted", k.Fingerprints())
	}
	if prev == nil && !a.closed {
		a.started = a.cfg.Clock.Now()
		a.heartbeatLocked()
	}
}

// HasKeys reports whether SetKeys was called: until then the replica owns
// nothing.
func (a *Announcer) HasKeys() bool { return a.keys.Load() != nil }

// Stop stops answering and heartbeating, and gives the kernel back its
// ARP: the host stops serving the addresses.
func (a *Announcer) Stop() error {
	a.shutdown()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.karp.remove()
}

// StopForSuccessor stops answering and heartbeating but leaves the
// kernel rules: a new process on this host, which takes the addresses
// over, keeps them (and replaces them in one transaction).
func (a *Announcer) StopForSuccessor() { a.shutdown() }

func (a *Announcer) shutdown() {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.closed = true
	a.stopping.Store(true)
	a.mine.Store(&map[netip.Addr]bool{})
	a.mu.Unlock()
	a.cancel()
	a.closeInterfaces()
	a.wg.Wait()
}

func (a *Announcer) closeInterfaces() {
	for _, ifc := range a.ifaces {
		ifc.close()
	}
}
