package lb

import (
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/ebbdev/ebb/internal/dataplane"
)

// stopper is a graceful stop in progress: once it begins, readiness fails.
type stopper struct {
	stopping atomic.Bool
}

// ready wraps a readiness check: not ready once the stop began.
func (s *stopper) ready(check func() bool) func() bool {
	return func() bool { return !s.stopping.Load() && check() }
}

// stop leaves without dropping a connection it can keep: it withdraws the
// announcements first and, if there were any, keeps accepting for
// ShutdownDelay while the routers move new flows to the other hosts; then
// it closes the listeners (a new connection is refused) and serves the
// established connections until they end or ShutdownTimeout runs out. The
// load balancer's report keeps counting them meanwhile. What is left then
// is closed by the caller (the data plane's Close), after the host stops
// accepting the addresses.
func (s *stopper) stop(log logr.Logger, o *Options, dp *dataplane.DataPlane, addrs *addressSinks) {
	s.stopping.Store(true)
	start := time.Now()
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
