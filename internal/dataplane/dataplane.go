// Package dataplane is ebb's L4 load balancer core: TCP and UDP frontends
// with backend sets whose backends carry an admin state with Azure Load
// Balancer's semantics (Down: no new connections at once, established ones
// continue), health probes, round-robin, least-connections and Maglev
// client-IP balancing, PROXY protocol v2, source-range allow lists, and
// atomic hot reconfiguration. It imports nothing from Kubernetes.
package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// Options configure a DataPlane. Every field is optional.
type Options struct {
	// Registerer takes the metrics. Default: a private registry.
	Registerer prometheus.Registerer
	Logger     logr.Logger
	// DialContext dials probe targets, and backends when GoroutineProxy
	// is set. Default: net.Dialer without TCP keep-alive (see
	// Frontend.TCPKeepAlive).
	DialContext func(ctx context.Context, network, address string) (net.Conn, error)
	// GoroutineProxy moves the proxy engine's TCP connections with two
	// goroutines each over Go's net package (dialing with DialContext),
	// instead of on the event loop (see loop.go). It is the way back
	// while the event loop is new, and the one for a custom dialer.
	GoroutineProxy bool
	// Clock paces the probes and the drain timeouts. Default: the real
	// clock.
	Clock Clock
	// Engine serves the frontends that name none. Default: EngineProxy.
	Engine Engine
	// KernelTable names the kernel engine's nftables tables (families ip
	// and ip6). Default: DefaultKernelTable.
	KernelTable string
	// KernelPath says how the kernel engine forwards flows. Default:
	// KernelPathNftables.
	KernelPath KernelPath
	// BPFPinDir is where the eBPF kernel path pins its maps and
	// attachments, so that they outlive the process (a bpffs mount,
	// mounted there if it is not). Default: DefaultBPFPinDir.
	BPFPinDir string
	// BPFInterfaces are the interfaces the eBPF kernel path forwards
	// from: where clients' packets and backends' replies arrive.
	// Default: every interface of the namespace but lo, when the path
	// first loads.
	BPFInterfaces []string
	// NetNS, if set, is a network namespace file descriptor whose
	// nftables the kernel engine programs and from which the event loop
	// connects to backends (tests); default: this process's.
	NetNS int
	// UDPFlows bounds the proxy engine's UDP flows (zero fields: the
	// defaults).
	UDPFlows UDPLimits
	// Inherited are listening sockets a predecessor handed over (see
	// Sockets and HandOver): a frontend whose protocol, address and port
	// match serves on one instead of opening its own. The data plane owns
	// them; ReleaseInherited closes those no frontend took.
	Inherited []*os.File
}

// Clock is what the data plane needs of a clock: tickers for the probes,
// timers for the drain timeouts (clock.RealClock and the fake clock of
// k8s.io/utils/clock/testing both are one).
type Clock interface {
	clock.WithTicker
	AfterFunc(d time.Duration, f func()) clock.Timer
}

// DataPlane serves a Config. Apply may be called at any time; it is safe
// for concurrent use.
type DataPlane struct {
	log   logr.Logger
	dial  dialFunc
	clock Clock
	m     *metrics

	conns     *connTable
	stopSweep chan struct{}
	// udpLimits bound the UDP flows; udpFlows counts them, on every
	// frontend; udpBuffers hold the datagrams read from backends.
	udpLimits UDPLimits
	udpFlows  atomic.Int64
	// held counts TCP connections paused between dial rounds (maxHeld).
	held atomic.Int64
	// looking counts the TCP connections accepted that have neither a
	// backend nor a refusal yet (dialing, or held between rounds): a
	// graceful stop waits for them as for the established ones.
	looking    atomic.Int64
	udpBuffers *sync.Pool
	// udpUnansweredIdle: the idle timeout of a flow its backend never
	// answered (tests shorten it).
	udpUnansweredIdle time.Duration
	// loop moves the proxy engine's TCP connections; nil with
	// Options.GoroutineProxy.
	loop *eventLoop

	engine Engine
	kernel kernelPath
	// kernelPathName is the kernel engine's path (metrics).
	kernelPathName KernelPath
	// otherKernel is the kernel path not chosen, and kernelSettled says
	// whether what predecessors left of either path was dealt with
	// (settleKernelLocked).
	otherKernel   kernelPath
	kernelSettled bool
	// kernelDirty asks for the kernel table to be rebuilt (a probe
	// changed a backend's health).
	kernelDirty chan struct{}
	// kernelInstalled: the table holds frontends, so the next change must
	// rebuild it even when no kernel frontend is left.
	kernelInstalled bool
	// kernelPrepareDue: a change left the kernel's prepared entries to a
	// later sync, which is scheduled.
	kernelPrepareDue atomic.Bool
	// autoKernelFailed is why the kernel path failed under a frontend
	// that engine Auto gave it; from then on Auto gives every frontend to
	// the proxy. kernelFailing: the kernel path's last sync failed under
	// a frontend that names the kernel engine (KernelFailing).
	autoKernelFailed error
	kernelFailing    bool
	// lastConfig is the configuration of the last Apply, applied again
	// when the kernel path fails between applies; applying: an Apply
	// runs (it deals with such a failure itself).
	lastConfig Config
	applying   bool

	mu        sync.Mutex // serialises Apply and Close
	frontends map[frontendKey]*frontend
	// owners is the node fast path's state, under a lock of its own so
	// that SetOwnerAdminState never waits for an Apply's slow parts
	// (sockets, probes, the kernel sync).
	owners  ownerAdmin
	probers map[probeKey]*prober
	closed  bool
	// inherited are the predecessor's sockets no frontend took yet.
	inherited map[frontendKey]*os.File
	// handedOver: a successor serves on the sockets (HandOver).
	handedOver bool
}

// New returns a DataPlane serving nothing.
func New(opts Options) (*DataPlane, error) {
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	if opts.DialContext == nil {
		opts.DialContext = (&net.Dialer{KeepAlive: -1}).DialContext
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	switch opts.Engine {
	case "":
		opts.Engine = EngineProxy
	case EngineProxy, EngineKernel, EngineAuto:
	default:
		return nil, fmt.Errorf("engine %q is not supported: use Proxy, Kernel or Auto", opts.Engine)
	}
	if opts.KernelPath == "" {
		opts.KernelPath = KernelPathNftables
	}
	kernel, err := newKernelPath(opts)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("registering data plane metrics: %w", err)
	}
	if e, ok := kernel.(*ebpfPath); ok {
		if err := registerEBPFMetrics(opts.Registerer, e); err != nil {
			return nil, fmt.Errorf("registering data plane metrics: %w", err)
		}
	}
	d := &DataPlane{
		log: opts.Logger, dial: opts.DialContext, clock: opts.Clock, m: m,
		conns: newConnTable(), stopSweep: make(chan struct{}),
		udpLimits: opts.UDPFlows.withDefaults(), udpBuffers: newUDPBuffers(), udpUnansweredIdle: udpUnansweredIdle,
		engine: opts.Engine, kernel: kernel, kernelPathName: opts.KernelPath, otherKernel: otherKernelPath(opts), kernelDirty: make(chan struct{}, 1),
		frontends: map[frontendKey]*frontend{}, probers: map[probeKey]*prober{}, inherited: map[frontendKey]*os.File{},
	}
	if !opts.GoroutineProxy {
		if d.loop, err = newEventLoop(d, opts.NetNS); err != nil {
			return nil, err
		}
	}
	d.adoptInherited(opts.Inherited)
	go d.conns.sweepIdle(d.clock, d.stopSweep)
	go d.resyncKernelOnProbes()
	return d, nil
}

// Apply makes cfg the data plane's configuration, frontend by frontend: a
// frontend that is invalid, claims the address, port and protocol of
// another, or whose socket cannot be opened is left out and listed in the
// result, and every other frontend applies (one bad address never stops the
// others). When it returns, every new connection follows the applied
// frontends. Listeners and established connections that cfg keeps are not
// disturbed; removed backends and frontends drain, and so does a running
// frontend that cfg now makes invalid. A backend's admin state is cfg's,
// unless SetOwnerAdminState has set its owner's (which wins). The error is
// set only when the data plane is closed.
func (d *DataPlane) Apply(cfg Config) (ApplyResult, error) {
	start := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ApplyResult{}, errors.New("data plane is closed")
	}
	if d.handedOver {
		return ApplyResult{}, errors.New("data plane handed its sockets over to a successor")
	}
	d.lastConfig, d.applying = cfg, true
	defer func() { d.applying = false }()
	fellBack := d.autoKernelFailed != nil
	res := d.applyLocked(cfg, start)
	if !fellBack && d.autoKernelFailed != nil {
		// The kernel path failed under frontends that Auto gave it: Auto
		// gives them to the proxy now (engineFor), at once.
		res = d.applyLocked(cfg, start)
	}
	d.kernelFailing = false
	for _, s := range res.Skipped {
		d.kernelFailing = d.kernelFailing || s.Reason == SkipKernelFailed
	}
	return res, nil
}

// applyLocked applies cfg; d.mu is held.
func (d *DataPlane) applyLocked(cfg Config, start time.Time) ApplyResult {
	admitted, skipped := d.admit(cfg)
	d.removeEngineSwitches(admitted)
	opened, failed := d.openListeners(admitted)
	skipped = append(skipped, failed...)
	frontends := make([]Frontend, 0, len(admitted))
	for _, fc := range admitted {
		_, running := d.frontends[fc.key()]
		if _, isNew := opened[fc.key()]; running || isNew {
			frontends = append(frontends, fc) // the others' sockets could not be opened
		}
	}
	probers := d.startProbers(frontends)
	want := make(map[frontendKey]bool, len(frontends))
	applied := make([]*frontend, 0, len(frontends))
	var started []*frontend
	d.owners.mu.Lock()
	for _, fc := range frontends {
		k := fc.key()
		want[k] = true
		f, ok := d.frontends[k]
		if !ok {
			f = newFrontend(d, k, opened[k])
			d.frontends[k] = f
			started = append(started, f)
		}
		f.apply(fc, probers, d.owners.stateOf)
		applied = append(applied, f)
	}
	d.owners.frontends = applied
	d.owners.mu.Unlock()
	// Removed frontends go before the kernel engine syncs, so that its
	// tables take them out too (their established flows continue).
	for k, f := range d.frontends {
		if !want[k] {
			f.remove()
			delete(d.frontends, k)
		}
	}
	skipped = append(skipped, d.syncKernelLocked(false)...)
	d.m.applySeconds.Observe(time.Since(start).Seconds())
	// The new configuration is in effect; what follows starts serving new
	// listeners and cleans up behind the old configuration.
	for _, f := range started {
		f.serve()
	}
	for k, p := range d.probers {
		if _, ok := probers[k]; !ok {
			p.stop(d.m)
		}
	}
	d.probers = probers
	d.m.setSkipped(skipped)
	d.m.setEngines(frontends, skipped, d.kernelPathName)
	return ApplyResult{Skipped: skipped}
}

// startProbers returns the probers cfg needs, reusing running ones so that
// their health carries over.
func (d *DataPlane) startProbers(frontends []Frontend) map[probeKey]*prober {
	out := map[probeKey]*prober{}
	for _, fc := range frontends {
		if fc.HealthCheck == nil {
			continue
		}
		for _, b := range fc.Backends {
			k := probeKeyFor(fc.HealthCheck, b)
			if _, ok := out[k]; ok {
				continue
			}
			if p, ok := d.probers[k]; ok {
				out[k] = p
				continue
			}
			out[k] = startProber(k, d.dial, d.clock, d.m, d.log, d.markKernelDirty)
		}
	}
	return out
}

// Close stops every listener, probe and connection.
func (d *DataPlane) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	d.owners.retire()
	// The kernel engine's table stays: the kernel keeps forwarding the
	// frontends' flows, established and new, until the next data plane
	// replaces the table (a restart or an upgrade drops nothing), or
	// RemoveKernelTable removes it.
	close(d.stopSweep)
	for k, f := range d.inherited {
		_ = f.Close()
		delete(d.inherited, k)
	}
	for k, f := range d.frontends {
		f.close()
		delete(d.frontends, k)
	}
	d.publishFrontendsLocked()
	d.conns.closeAll() // removed backends' draining connections too
	if d.loop != nil {
		d.loop.stop()
	}
	d.kernel.close()
	for k, p := range d.probers {
		p.stop(d.m)
		delete(d.probers, k)
	}
	return nil
}

// BackendStatus is the state of one backend, for reports and tests.
type BackendStatus struct {
	Frontend   string
	Address    netip.AddrPort
	Owner      string
	AdminState AdminState
	// Healthy is the probe's verdict (true without a health check).
	Healthy bool
	// Confirmed: a probe has succeeded (true without a health check).
	// Healthy starts true; only Confirmed says the backend was reached.
	Confirmed bool
	// Eligible means new connections may go to the backend (for the
	// kernel engine: the table installed in the kernel says so).
	Eligible bool
	// Active counts established TCP connections (or live UDP flows).
	Active int64
}

// Status returns every configured backend, sorted by frontend and address.
// A kernel-engine backend's Active is the number of its flows in the
// kernel's connection tracking.
func (d *DataPlane) Status() []BackendStatus {
	d.mu.Lock()
	var out []BackendStatus
	kernel := map[flowKey]flowLabel{}
	// The kernel-engine backends: their index in out and their flows.
	type kernelBackend struct {
		at    int
		flows flowKey
	}
	var kernelAt []kernelBackend
	for _, f := range d.frontends {
		set := f.set.Load()
		for _, b := range set.backends {
			p := b.probe.Load()
			eligible := b.eligible()
			if f.kernel {
				eligible = b.inKernel.Load()
				key := flowKey{frontend: f.key, backend: b.key}
				kernel[key] = b.flowLabel
				kernelAt = append(kernelAt, kernelBackend{at: len(out), flows: key})
			}
			out = append(out, BackendStatus{
				Frontend: set.cfg.Name, Address: b.key, Owner: b.owner,
				AdminState: adminStates[b.admin.Load()],
				Healthy:    p == nil || p.healthy.Load(), Confirmed: p == nil || p.confirmed.Load(),
				Eligible: eligible, Active: b.active.Load(),
			})
		}
	}
	d.mu.Unlock()
	if len(kernelAt) > 0 {
		// Outside the lock: the conntrack table may be long.
		counts, err := d.kernel.activeFlows(kernel)
		if err != nil {
			d.log.Error(err, "Counting the kernel engine's flows; reporting none")
		}
		for _, k := range kernelAt {
			out[k.at].Active = counts[k.flows]
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Frontend != out[j].Frontend {
			return out[i].Frontend < out[j].Frontend
		}
		return out[i].Address.Compare(out[j].Address) < 0
	})
	return out
}

// Addr returns the address a frontend listens on, or nil.
func (d *DataPlane) Addr(name string) net.Addr {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, f := range d.frontends {
		if f.set.Load().cfg.Name == name {
			return f.addr()
		}
	}
	return nil
}

// SetOwnerAdminState sets the admin state of every backend owned by owner
// (a node), in every frontend, at once, and returns how many backends it
// set. It is the fast path for a node that starts or stops leaving: it
// touches nothing else and takes effect for new connections before it
// returns. It does not wait for the slow parts of an Apply that is
// running (sockets, probes, the kernel sync): the proxy's frontends change
// once the Apply's loop over the backend sets is done; the kernel
// engine's, when its entries were prepared for the change, once a kernel
// sync in progress is done, else by a sync after the Apply. From the first
// call for an owner on, the owner's backends carry the state it last set,
// in this and every later Apply, whatever the configuration says (a
// configuration computed before the change must not undo it); the
// caller's configuration should agree (lbmodel derives both from the
// node's taints).
func (d *DataPlane) SetOwnerAdminState(owner string, state AdminState) (int, error) {
	start := time.Now()
	if owner == "" {
		return 0, errors.New("owner is required")
	}
	switch state {
	case AdminNone, AdminDown, AdminUp:
	default:
		return 0, fmt.Errorf("admin state %q is not supported: use None, Down or Up", state)
	}
	n, kernel := d.owners.set(owner, toAdminState(state))
	if kernel && !d.flipKernel(owner) {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.closed {
			return n, nil
		}
		if skipped := d.setKernelOwnerLocked(owner); len(skipped) > 0 {
			return n, fmt.Errorf("setting %s's backends %s in the kernel engine: %w", owner, state, skipped[0].Err)
		}
	}
	d.m.applySeconds.Observe(time.Since(start).Seconds())
	return n, nil
}

// ForgetOwnerAdminState ends SetOwnerAdminState's hold on owner, and
// reports whether there was one: from the next Apply on, its backends
// carry the configuration's admin states again, which may then differ from
// one frontend to another (lbsync's cut-off LB host).
func (d *DataPlane) ForgetOwnerAdminState(owner string) bool {
	d.owners.mu.Lock()
	defer d.owners.mu.Unlock()
	_, held := d.owners.states[owner]
	delete(d.owners.states, owner)
	return held
}

// StopAccepting closes every frontend's TCP listener, the first step of a
// graceful stop: established connections continue, and a new connection
// finds no socket (the host refuses it). UDP sockets stay open until
// Close, since a UDP flow has no connection to finish. Kernel-engine
// frontends have no socket: the kernel keeps forwarding them after the
// process is gone.
func (d *DataPlane) StopAccepting() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, f := range d.frontends {
		f.closeListener()
	}
}

// Connections counts the user-space proxy's TCP connections: the
// established ones, and those accepted that are still looking for a
// backend (dialing, or held while their backends refuse), which a
// graceful stop must wait for too.
func (d *DataPlane) Connections() int { return d.conns.len() + int(d.looking.Load()) }
