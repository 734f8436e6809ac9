package service

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Service controller's own metrics (prefix
// ebb_service_lb_), next to controller-runtime's reconcile metrics.
type Metrics struct {
	syncFailures *prometheus.CounterVec
}

// NewMetrics registers the controller's metrics, reading the allocations
// from ipam.
func NewMetrics(reg prometheus.Registerer, ipam *Allocator) (*Metrics, error) {
	allocated := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ebb_service_lb_addresses_allocated",
		Help: "Load-balancer addresses held by Services.",
	}, func() float64 { return float64(ipam.InUse()) })
	m := &Metrics{syncFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ebb_service_lb_sync_failures_total",
		Help: "Failed attempts to give a Service its load balancer; reason is unsupported_protocol, allocation or address_conflict.",
	}, []string{"reason"})}
	for _, c := range []prometheus.Collector{allocated, m.syncFailures, poolCollector{ipam}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// poolCollector exports each address pool's size and use at each scrape,
// as its status says them: ebb_addresspool_addresses{pool, family,
// state="assigned"|"available"}, for the families the pool has addresses
// of.
type poolCollector struct{ ipam *Allocator }

var poolAddresses = prometheus.NewDesc("ebb_addresspool_addresses",
	"Addresses of each address pool (the AddressPools, and --vip-pool's) by family and state: assigned to Services, or available; a family the pool has no address of has no series.",
	[]string{"pool", "family", "state"}, nil)

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) { ch <- poolAddresses }

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.ipam.Pools() {
		size4, size6 := p.size()
		used4, used6 := c.ipam.Usage(p)
		for _, f := range []struct {
			family     string
			size, used int64
		}{{"IPv4", size4, used4}, {"IPv6", size6, used6}} {
			if f.size == 0 {
				continue
			}
			ch <- prometheus.MustNewConstMetric(poolAddresses, prometheus.GaugeValue, float64(f.used), p.Name, f.family, "assigned")
			ch <- prometheus.MustNewConstMetric(poolAddresses, prometheus.GaugeValue, float64(max(0, f.size-f.used)), p.Name, f.family, "available")
		}
	}
}

// failed counts a failure; a nil Metrics counts nothing (unit tests).
func (m *Metrics) failed(reason string) {
	if m != nil {
		m.syncFailures.WithLabelValues(reason).Inc()
	}
}
