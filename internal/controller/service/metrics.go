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
	for _, c := range []prometheus.Collector{allocated, m.syncFailures} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// failed counts a failure; a nil Metrics counts nothing (unit tests).
func (m *Metrics) failed(reason string) {
	if m != nil {
		m.syncFailures.WithLabelValues(reason).Inc()
	}
}
