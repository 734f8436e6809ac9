package lb

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/ebbdev/ebb/internal/dataplane"
)

// stopper is a graceful stop in progress: once it begins, readiness fails.
type stopper struct {
	stopping atomic.Bool
	// drain, when set, reports this host draining, so that the other LB
	// hosts forward the segments of its connections that the routers move
	// to them once it withdraws (moved flows, flows.go).
	drain func()
}

// ready wraps a readiness check: not ready once the stop began.
func (s *stopper) ready(check func() bool) func() bool {
	return func() bool { return !s.stopping.Load() && check() }
}

// stop leaves without dropping a connection it can keep: it reports itself
// draining (with drain, waiting --withdraw-delay), withdraws the
// announcements and, if there were any, keeps accepting for
// ShutdownDelay while the routers move new flows to the other hosts; then
// it closes the listeners (a new connection is refused) and serves the
// established connections until they end or ShutdownTimeout runs out. The
// load balancer's report keeps counting them meanwhile. What is left then
// is closed by the caller (the data plane's Close), after the host stops
// accepting the addresses.
func (s *stopper) stop(log logr.Logger, o *Options, dp *dataplane.DataPlane, addrs *addressSinks) {
	s.stopping.Store(true)
	start := time.Now()
	if s.drain != nil && addrs.announcing() {
		// As for a leaving host: the others learn first, then the routers.
		// Without it, a connection the routers move in the middle (an L2
		// takeover moves every flow at once) is reset by its new host.
		s.drain()
		if o.WithdrawDelay > 0 {
			log.Info("Draining: the other LB hosts forward this host's connections that the routers move to them", "withdrawingAfter", o.WithdrawDelay)
			time.Sleep(o.WithdrawDelay)
		}
	}
	if addrs.withdraw() && o.ShutdownDelay > 0 {
		log.Info("Withdrew the announcements; accepting new connections while they move elsewhere", "for", o.ShutdownDelay)
		time.Sleep(o.ShutdownDelay)
	}
	dp.StopAccepting()
	n := dp.Connections()
	log.Info("Stopped accepting new connections; serving the established ones", "connections", n, "timeout", o.ShutdownTimeout)
	timeout := time.NewTimer(o.ShutdownTimeout)
	defer timeout.Stop()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	lastLog := time.Now()
	for ; n > 0; n = dp.Connections() {
		select {
		case <-timeout.C:
			log.Info("Shutdown timeout: closing the connections left", "connections", n, "after", time.Since(start).Round(time.Millisecond))
			return
		case <-poll.C:
		}
		if time.Since(lastLog) >= 5*time.Second {
			log.Info("Waiting for established connections to end", "connections", n)
			lastLog = time.Now()
		}
	}
	log.Info("Every connection ended", "after", time.Since(start).Round(time.Millisecond))
}

// successorProbeInterval is how often a process that stops without having
// handed over looks for a successor serving beside it.
const successorProbeInterval = time.Second

// stopBeside runs the graceful stop while watching for a new ebb lb that
// serves on this host without a hand-off (a DaemonSet's surge pod started
// after this one was told to stop). Such a successor probes its readiness
// on the same host address as this process, so once it is there this
// process lets go of the metrics and readiness address at once rather than
// after its connections: otherwise the new pod is answered "not ready" by
// the old process for as long as the old one drains.
func (o *Options) stopBeside(log logr.Logger, h *handover, s *stopper, dp *dataplane.DataPlane, addrs *addressSinks, stopDebug func()) {
	watching, stopWatching := context.WithCancel(context.Background())
	defer stopWatching()
	go h.watchSuccessor(watching, successorProbeInterval, func(pid int) {
		log.Info("Another ebb lb serves on this host: leaving it the metrics and readiness address", "pid", pid)
		stopDebug()
	})
	s.stop(log, o, dp, addrs)
}
