package lb

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/cmd/kubeconfig"
	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/flowfwd"
	"github.com/ebbdev/ebb/internal/lbsync"
)

// movedFlows keeps internal/flowfwd's rule in step with this replica: the
// addresses it serves, whether its host drains, and which other LB hosts
// drain. Each change is written at once; a failed write is logged and
// retried at the next change.
type movedFlows struct {
	log logr.Logger
	fwd *flowfwd.Forwarder

	mu    sync.Mutex
	state flowfwd.State
	// draining and serving are the other LB hosts (lbsync.DrainingPeers);
	// self is this host; joining: it started announcing a short while ago
	// (at self.Joined). The rule forwards to the draining hosts, and while
	// joining to the serving ones that joined before this one (so that
	// forwarding never loops).
	draining []netip.Addr
	serving  []lbsync.Peer
	self     lbsync.Peer
	joining  bool
	// retired: a successor owns the table now (the hand-off).
	retired bool
}

func newMovedFlows(log logr.Logger, table string) *movedFlows {
	return &movedFlows{log: log.WithName("flows"), fwd: flowfwd.New(table, 0)}
}

// start installs the rule before any host drains: connection tracking
// must know this host's own flows from their first packet.
func (m *movedFlows) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fwd.Sync(m.state)
}

func (m *movedFlows) update(change func(*flowfwd.State)) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	change(&m.state)
	m.state.Peers = forwardTargets(m.draining, m.serving, m.self, m.joining)
	if m.retired {
		return
	}
	if err := m.fwd.Sync(m.state); err != nil {
		m.log.Error(err, "Updating the forwarding of moved flows")
	}
}

func (m *movedFlows) setFrontends(fes []netip.AddrPort) {
	m.update(func(s *flowfwd.State) { s.Frontends = fes })
}

// tcpFrontends are the addresses and ports of the TCP frontends among
// ports: the only flows that can move.
func tcpFrontends(ports []dataplane.ServedPort) []netip.AddrPort {
	var out []netip.AddrPort
	for _, p := range ports {
		if p.Protocol == dataplane.TCP {
			out = append(out, p.AddrPort)
		}
	}
	return out
}

func (m *movedFlows) setDraining(on bool) {
	m.update(func(s *flowfwd.State) { s.Draining = on })
}

// SetPeers is told the other LB hosts (lbsync.DrainingPeers).
func (m *movedFlows) SetPeers(draining []netip.Addr, serving []lbsync.Peer) {
	m.update(func(*flowfwd.State) { m.draining, m.serving = draining, serving })
}

// setJoining says whether this host started announcing a short while ago,
// and when.
func (m *movedFlows) setJoining(on bool, since time.Time) {
	m.update(func(*flowfwd.State) { m.joining, m.self.Joined = on, since })
}

// forwardTargets are where the segments of moved flows go: the draining
// hosts (they keep their connections), and while this host joins, the
// serving hosts that joined before it (the routers moved some of their
// flows here). Forwarding only to earlier joiners keeps it from looping.
func forwardTargets(draining []netip.Addr, serving []lbsync.Peer, self lbsync.Peer, joining bool) []netip.Addr {
	out := append([]netip.Addr(nil), draining...)
	if joining {
		for _, p := range serving {
			if p.JoinedBefore(self) {
				out = append(out, p.Addr)
			}
		}
	}
	return out
}

// repair writes the table again if someone else removed or changed it.
func (m *movedFlows) repair() (bool, error) {
	if m == nil {
		return false, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.retired {
		return false, nil
	}
	return m.fwd.Repair()
}

// retire leaves the table to a successor.
func (m *movedFlows) retire() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.retired = true
}

// close removes the table, unless a successor owns it.
func (m *movedFlows) close() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.retired {
		return
	}
	if err := m.fwd.Remove(); err != nil {
		m.log.Error(err, "Removing the forwarding of moved flows")
	}
}

// collector exposes the rule's mode and its count of foreign segments.
func (m *movedFlows) collector() prometheus.Collector { return flowsCollector{m} }

type flowsCollector struct{ m *movedFlows }

var (
	foreignSegmentsDesc = prometheus.NewDesc("ebb_lb_moved_flow_segments_total",
		"TCP segments to a frontend, of flows this host does not know (moved here by the routers, or forwarded by another LB host), since the forwarding rules were last rewritten; mode is pass (answered with a reset, unless another host forwarded it: dropped), forward (sent to the draining LB hosts) or drop (this host drains).",
		[]string{"mode"}, nil)
	drainingPeersDesc = prometheus.NewDesc("ebb_lb_moved_flow_targets",
		"Other LB hosts to which this host forwards the segments of moved flows: the draining ones, and the steady ones while this host joins.", nil, nil)
)

func (c flowsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- foreignSegmentsDesc
	ch <- drainingPeersDesc
}

func (c flowsCollector) Collect(ch chan<- prometheus.Metric) {
	segs, mode, err := c.m.fwd.Segments()
	if err == nil {
		ch <- prometheus.MustNewConstMetric(foreignSegmentsDesc, prometheus.CounterValue, float64(segs), string(mode))
	}
	c.m.mu.Lock()
	peers := len(c.m.state.Peers)
	c.m.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(drainingPeersDesc, prometheus.GaugeValue, float64(peers))
}

// startMovedFlows installs the forwarding of moved flows and follows the
// other LB hosts for it (cluster mode, --forward-moved-flows).
func (o *Options) startMovedFlows(ctx context.Context, log logr.Logger, reg prometheus.Registerer, addrs *addressSinks) (*movedFlows, error) {
	if !o.ForwardMovedFlows {
		return nil, nil
	}
	flows := newMovedFlows(log, flowfwd.DefaultTable)
	flows.self.Node = o.NodeName
	if err := flows.start(); err != nil {
		return nil, fmt.Errorf("installing the forwarding of moved flows (--forward-moved-flows=false to do without; needs CAP_NET_ADMIN): %w", err)
	}
	if err := reg.Register(flows.collector()); err != nil {
		return nil, err
	}
	cfg, err := kubeconfig.Load(o.Kubeconfig)
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := ctrlcache.New(cfg, ctrlcache.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating a cache of the other load-balancer hosts: %w", err)
	}
	addrs.mu.Lock()
	addrs.flows = flows
	addrs.withdrawAfter = o.WithdrawDelay
	addrs.mu.Unlock()
	peers := &lbsync.DrainingPeers{Cache: c, Self: o.NodeName, Model: o.Model, OnChange: flows.SetPeers}
	go func() {
		if err := peers.Run(ctx); err != nil {
			log.Error(err, "Following the other load-balancer hosts: moved flows are not forwarded")
		}
	}()
	return flows, nil
}

// joinWindow is the time after this host starts announcing during which
// it forwards the segments of the other hosts' flows that the routers
// move to it (the routers re-hash some established flows onto a new next
// hop).
type joinWindow struct {
	set func(on bool, since time.Time)

	mu    sync.Mutex
	timer *time.Timer
}

// open starts (or restarts) the window of length d.
func (j *joinWindow) open(d time.Duration) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.timer != nil {
		j.timer.Stop()
	}
	if d <= 0 {
		return
	}
	since := time.Now()
	j.set(true, since)
	j.timer = time.AfterFunc(d, func() { j.set(false, since) })
}

// close ends the window now.
func (j *joinWindow) close() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.timer != nil {
		j.timer.Stop()
		j.timer = nil
	}
	j.set(false, time.Time{})
}
