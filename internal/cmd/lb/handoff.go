package lb

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/handoff"
)

// A seamless restart or upgrade on one host: the new `ebb lb` (the
// successor) takes the listening sockets of the running one (the
// predecessor) over --handoff-socket before it opens any, serves on them,
// and tells the predecessor so; the predecessor then stops accepting and
// stops syncing, closes its BGP sessions without withdrawing (graceful
// restart keeps the routes on the routers), serves its established
// connections until they end, and leaves the local routes and the kernel
// tables in place. Only then does the successor open its BGP sessions and
// become ready. No connection is refused or reset on the way: the sockets
// and their accept queues never close.

// takeSockets asks a predecessor on this host for its sockets; nil when
// there is none, hand-off is off, or it fails (logged: the successor then
// opens its own sockets, as a first process does).
func (o *Options) takeSockets(ctx context.Context, log logr.Logger) *handoff.Taken {
	if o.HandoffSocket == "" && o.LegacyHandoffSocket == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var taken *handoff.Taken
	var err error
	if o.HandoffSocket != "" {
		taken, err = handoff.Take(ctx, o.HandoffSocket)
	}
	if err == nil && taken == nil && o.LegacyHandoffSocket != "" && o.LegacyHandoffSocket != o.HandoffSocket {
		// An earlier version offers there: the upgrade from it.
		if taken, err = handoff.Take(ctx, o.LegacyHandoffSocket); taken != nil {
			log.Info("Took the sockets from an ebb lb of an earlier version at the legacy hand-off socket", "socket", o.LegacyHandoffSocket)
		}
	}
	if err != nil {
		log.Error(err, "Could not take the sockets of the ebb lb running on this host; opening new ones")
		return nil
	}
	if taken != nil {
		log.Info("Took the listening sockets of the ebb lb running on this host", "predecessor", taken.PID, "sockets", len(taken.Files))
	}
	return taken
}

// resolveHandoffSocket turns --handoff-socket=auto into its path, in a
// directory of its own made 0700: only this user (root, in a pod) may
// reach the socket. A path given by hand is used as it is (its directory
// made if missing, never changed: it may be /tmp). A failure turns the
// path off (logged): the process then asks only the legacy socket, and
// opens its own sockets when nobody offers there either.
func (o *Options) resolveHandoffSocket(log logr.Logger) {
	if o.HandoffSocket != DefaultHandoffSocket {
		if o.HandoffSocket != "" && !strings.HasPrefix(o.HandoffSocket, "@") {
			if err := os.MkdirAll(filepath.Dir(o.HandoffSocket), 0o700); err != nil {
				log.Error(err, "Preparing the hand-off socket's directory: no hand-off at it", "socket", o.HandoffSocket)
				o.HandoffSocket = ""
			}
		}
		return
	}
	p, err := handoffSocketPath(handoffRunDir)
	if err == nil {
		err = privateDir(filepath.Dir(p))
	}
	if err != nil {
		log.Error(err, "Preparing the hand-off socket: no hand-off at it")
		o.HandoffSocket = ""
		return
	}
	o.HandoffSocket = p
}

// privateDir makes dir (the auto socket's own directory) if missing, and
// 0700.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("making %s private: %w", dir, err)
	}
	return nil
}

// handoffSocketPath is --handoff-socket=auto's socket under dir: one per
// network namespace, named by the namespace's inode, which every process
// of the namespace sees alike.
func handoffSocketPath(dir string) (string, error) {
	link, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		return "", fmt.Errorf("reading this process's network namespace: %w", err)
	}
	inode := strings.TrimSuffix(strings.TrimPrefix(link, "net:["), "]")
	if inode == "" || strings.ContainsAny(inode, "/[]") {
		return "", fmt.Errorf("unexpected network namespace link %q", link)
	}
	return filepath.Join(dir, "net-"+inode, "handoff.sock"), nil
}

// handover runs both sides of the hand-off for one process.
type handover struct {
	address string
	// legacy is where an earlier version offers (--handoff-legacy-socket).
	legacy string
	log    logr.Logger
	dp     *dataplane.DataPlane
	addrs  *addressSinks
	// taken is what the predecessor handed over; nil without one.
	taken *handoff.Taken
	// onHandOver run once this process has handed over: the report then
	// says it sends no node a new connection, and the metrics address is
	// left to the successor.
	onHandOver []func()
	// synced, if set, says that the first configuration is applied: when
	// there is no predecessor, the BGP sessions a restart held back open
	// then (not waiting for what serving adds for a take-over, such as
	// the L2 keys). Unset: serving.
	synced func() bool
	// onTookOver, if set, is told how a take-over from a predecessor
	// ended (err nil: confirmed), and how many sockets were taken.
	onTookOver func(predecessor, sockets int, err error)
	m          *prometheus.CounterVec

	offer       atomic.Pointer[handoff.Offer]
	cancelOffer context.CancelFunc

	// tookOver: the predecessor, if any, has released the host to this
	// process (ready may be true only then).
	tookOver atomic.Bool
	// gave: this process handed its sockets to a successor.
	gave atomic.Bool
	// beside is the PID of another ebb lb found serving on this host while
	// this one stopped without a hand-off (watchSuccessor); 0: none.
	beside atomic.Int64
	// started: run is running (start); done closes when it returns.
	started bool
	done    chan struct{}
}

func newHandover(address string, log logr.Logger, dp *dataplane.DataPlane, addrs *addressSinks, taken *handoff.Taken, reg prometheus.Registerer) (*handover, error) {
	m := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ebb_lb_handoffs_total",
		Help: "Hand-offs of the listening sockets between ebb lb processes on this host; role is predecessor (gave them) or successor (took them), result is success or error.",
	}, []string{"role", "result"})
	if err := reg.Register(m); err != nil {
		return nil, err
	}
	return &handover{address: address, log: log.WithName("handoff"), dp: dp, addrs: addrs, taken: taken, m: m, done: make(chan struct{})}, nil
}

// run takes over from the predecessor once serving says this process
// serves (unless ctx ends first), then offers the sockets to a successor
// until offering ends (settle); when a successor takes them, stopSyncing
// ends this process's configuration loop and the process keeps only its
// established connections.
func (h *handover) run(ctx, offering context.Context, serving func() bool, stopSyncing func()) {
	defer close(h.done)
	if !h.takeOver(ctx, serving) {
		return
	}
	if h.address == "" {
		return
	}
	offer, err := handoff.Listen(h.log, h.address)
	if err != nil {
		h.log.Error(err, "Not offering this process's sockets to a successor: a restart on this host will drop connections")
		return
	}
	h.offer.Store(offer)
	successor, err := offer.Serve(offering, h.dp.Sockets)
	if err != nil {
		return // stopping
	}
	stopSyncing()
	h.dp.HandOver()
	h.addrs.retire()
	for _, f := range h.onHandOver {
		f()
	}
	h.gave.Store(true)
	if err := successor.Release(); err != nil {
		h.log.Error(err, "Telling the successor it serves alone", "successor", successor.PID)
	}
	h.m.WithLabelValues("predecessor", "success").Inc()
	h.log.Info("Handed the sockets over to a successor; serving the established connections only", "successor", successor.PID)
}

// takeOver waits until this process serves, then has the predecessor
// release the host, and opens the BGP sessions; false if ctx ended first.
func (h *handover) takeOver(ctx context.Context, serving func() bool) bool {
	if h.taken == nil {
		h.tookOver.Store(true)
		// No predecessor; but one that crashed leaves the sessions held
		// back too (restarting, in Run): a restarting speaker that
		// connected before its first Sync would send the routers an
		// empty table and its End-of-RIB, and they would drop the routes
		// they kept for this host. Readiness does not wait for them, as
		// it never waited for BGP.
		if h.addrs.bgpWaiting() {
			synced := serving
			if h.synced != nil {
				synced = h.synced
			}
			if !waitServing(ctx, synced) {
				return false
			}
			if err := h.addrs.connectBGP(ctx); err != nil {
				h.log.Error(err, "Opening the BGP sessions")
			}
		}
		return true
	}
	if !waitServing(ctx, serving) {
		h.taken.Abort()
		return false
	}
	if n := h.dp.ReleaseInherited(); n > 0 {
		h.log.Info("Closed the predecessor's sockets of frontends this configuration does not have", "sockets", n)
	}
	result := "success"
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := h.taken.Serving(wait)
	if err != nil {
		result = "error"
		h.log.Error(err, "The predecessor did not confirm the hand-off; serving anyway")
	}
	h.m.WithLabelValues("successor", result).Inc()
	if h.onTookOver != nil {
		h.onTookOver(h.taken.PID, len(h.taken.Files), err)
	}
	// The predecessor may have removed the local routes if it stopped
	// instead of handing over: make them this process's again.
	if err := h.addrs.Sync(h.dp.Addresses()); err != nil {
		h.log.Error(err, "Making the load balancer's addresses local to this host after the hand-off")
	}
	// So may it have removed the guard and the other tables, which this
	// process's Sync, having written them already, would not write again.
	if parts, err := repairParts(h.addrs.repairParts()); err != nil || len(parts) > 0 {
		h.log.Info("Wrote again the kernel state the predecessor removed", "parts", parts, "err", err)
	}
	if err := h.addrs.connectBGP(ctx); err != nil {
		h.log.Error(err, "Opening the BGP sessions")
	}
	h.log.Info("Took over from the predecessor", "predecessor", h.taken.PID)
	h.tookOver.Store(true)
	return true
}

// waitServing waits until serving says so; false if ctx ended first.
func waitServing(ctx context.Context, serving func() bool) bool {
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for !serving() {
		select {
		case <-ctx.Done():
			return false
		case <-poll.C:
		}
	}
	return true
}

// ready says whether this process is the one serving the host.
func (h *handover) ready() bool { return h.tookOver.Load() && !h.gave.Load() }

// handedOver reports whether a successor serves in this process's place.
func (h *handover) handedOver() bool { return h.gave.Load() }

// start runs run in the background. Offering outlives ctx: see settle.
func (h *handover) start(ctx context.Context, serving func() bool, stopSyncing func()) {
	h.started = true
	offering, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h.cancelOffer = cancel
	go h.run(ctx, offering, serving, stopSyncing)
}

// settle ends offering the sockets, once this process is told to stop,
// and reports whether it handed them over. A successor taking over at that
// moment is given up to timeout to finish first: in a DaemonSet's rolling
// update the old pod may be stopped as soon as the new one looks ready,
// which can be before the new process serves, and finishing the hand-off
// then keeps every connection where stopping first would not.
func (h *handover) settle(log logr.Logger, timeout time.Duration) bool {
	if !h.started {
		if h.taken != nil {
			h.taken.Abort() // the predecessor serves on
		}
		return false
	}
	if o := h.offer.Load(); o != nil && o.Taking() {
		log.Info("A successor is taking over: letting it finish before stopping", "timeout", timeout)
		for deadline := time.Now().Add(timeout); o.Taking() && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
	}
	h.cancelOffer()
	<-h.done
	return h.gave.Load()
}

// watchSuccessor looks for another ebb lb offering its sockets on this
// host (one that started while this process stopped without handing over:
// it serves on sockets of its own) every interval until ctx ends; found
// runs once with its PID. Nothing to look for after a hand-off: the
// successor then owns everything already.
func (h *handover) watchSuccessor(ctx context.Context, interval time.Duration, found func(pid int)) {
	if (h.address == "" && h.legacy == "") || h.gave.Load() {
		return
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		probe, cancel := context.WithTimeout(ctx, interval)
		var pid int
		var err error
		// At the path; at the legacy socket, an earlier version started
		// beside this one (a rollback).
		for _, addr := range []string{h.address, h.legacy} {
			if addr != "" && pid == 0 {
				pid, err = handoff.Probe(probe, addr)
			}
		}
		cancel()
		// This process's own offer is closed by now (settle returned), so
		// whoever answers is another ebb lb.
		if err == nil && pid != 0 {
			h.beside.Store(int64(pid))
			found(pid)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// successorBeside returns the PID of the ebb lb that watchSuccessor found
// serving beside this process, or 0.
func (h *handover) successorBeside() int { return int(h.beside.Load()) }
