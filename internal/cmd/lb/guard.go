package lb

import (
	"net/netip"
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/vipguard"
)

// addressGuard keeps this host's own services off the addresses it serves
// (internal/vipguard): the addresses ebb's local routes made local pass
// only their frontends' ports. It follows every sync of the addresses.
type addressGuard struct {
	log   logr.Logger
	guard *vipguard.Guard
	// ports are the frontends being served (DataPlane.Ports).
	ports func() []dataplane.ServedPort
	// tracked: the kernel engine's nftables path may serve here, so
	// conntrack runs anyway and the guard lets tracked connections pass
	// (vipguard.State.Tracked).
	tracked bool

	mu sync.Mutex
	// retired: a successor owns the table now (the hand-off).
	retired bool
}

func newAddressGuard(log logr.Logger, ports func() []dataplane.ServedPort, tracked bool) *addressGuard {
	return &addressGuard{
		log:     log.WithName("guard"),
		guard:   vipguard.New(vipguard.DefaultTable, 0),
		ports:   ports,
		tracked: tracked,
	}
}

// sync guards the addresses (those ebb's local routes cover), letting
// their frontends through.
func (g *addressGuard) sync(addresses []netip.Addr) error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.retired {
		return nil
	}
	return g.guard.Sync(guardState(addresses, g.ports(), g.tracked))
}

func guardState(addresses []netip.Addr, ports []dataplane.ServedPort, tracked bool) vipguard.State {
	s := vipguard.State{Addresses: addresses, Tracked: tracked}
	for _, p := range ports {
		proto := uint8(unix.IPPROTO_TCP)
		if p.Protocol == dataplane.UDP {
			proto = unix.IPPROTO_UDP
		}
		s.Ports = append(s.Ports, vipguard.Port{Addr: p.AddrPort.Addr(), Protocol: proto, Port: p.AddrPort.Port()})
	}
	return s
}

// repair writes the table again if someone else removed or changed it.
func (g *addressGuard) repair() (bool, error) {
	if g == nil {
		return false, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.retired {
		return false, nil
	}
	return g.guard.Repair()
}

// retire leaves the table to a successor.
func (g *addressGuard) retire() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.retired = true
}

// close removes the table, unless a successor owns it. It runs after the
// local routes are gone: the addresses are no longer the host's.
func (g *addressGuard) close() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.retired {
		return
	}
	if err := g.guard.Remove(); err != nil {
		g.log.Error(err, "Removing the table that keeps this host's own services off the load-balancer addresses")
	}
}

// Describe and Collect expose the packets dropped.
func (g *addressGuard) Describe(ch chan<- *prometheus.Desc) {
	ch <- guardDroppedDesc
}

var guardDroppedDesc = prometheus.NewDesc("ebb_lb_guard_dropped_packets_total",
	"Packets to a load-balancer address served here on a protocol and port that no frontend serves (the host's own services, scans), dropped since the guard's table was last written whole.", nil, nil)

func (g *addressGuard) Collect(ch chan<- prometheus.Metric) {
	if n, err := g.guard.Dropped(); err == nil {
		ch <- prometheus.MustNewConstMetric(guardDroppedDesc, prometheus.CounterValue, float64(n))
	}
}
