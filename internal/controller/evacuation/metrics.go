package evacuation

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// Metrics are the Evacuation controller's metrics. The gauges are counted
// from the cache when Prometheus scrapes, not on every reconcile.
type Metrics struct {
	evictions   *prometheus.CounterVec
	evacuators  *prometheus.Desc
	evacuations *prometheus.Desc

	mu     sync.Mutex
	reader client.Reader // set by the controller; nil: no gauges yet
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ebb_evacuation_evictions_total", Help: "Eviction API calls by result: evicted, blocked (a PodDisruptionBudget said no), conflict (a 409 while the pod is still there: retried with the same backoff), gone, error.",
		}, []string{"result"}),
		evacuators: prometheus.NewDesc("ebb_evacuation_active_evacuators", "Evacuations by active evacuator class.", []string{"class"}, nil),
		evacuations: prometheus.NewDesc("ebb_evacuation_evacuations",
			"Evacuations by phase: Pending (no evacuator yet), Evacuating (an evacuator is active), Evicting (the Eviction API fallback).", []string{"phase"}, nil),
	}
	for _, c := range []prometheus.Collector{m.evictions, m} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering evacuation metrics: %w", err)
		}
	}
	return m, nil
}

// readFrom makes the gauges count the Evacuations reader lists.
func (m *Metrics) readFrom(reader client.Reader) {
	m.mu.Lock()
	m.reader = reader
	m.mu.Unlock()
}

// Describe implements prometheus.Collector for the gauges.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.evacuators
	ch <- m.evacuations
}

// Collect counts the Evacuations by phase and active evacuator class.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	reader := m.reader
	m.mu.Unlock()
	if reader == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var list v1alpha1.EvacuationList
	if err := reader.List(ctx, &list); err != nil {
		return
	}
	phases := map[string]float64{PhasePending: 0, PhaseEvacuating: 0, PhaseEvicting: 0}
	classes := map[string]float64{}
	for i := range list.Items {
		e := &list.Items[i]
		phases[Phase(e)]++
		if e.Status.ActiveEvacuatorClass != "" {
			classes[e.Status.ActiveEvacuatorClass]++
		}
	}
	for p, n := range phases {
		ch <- prometheus.MustNewConstMetric(m.evacuations, prometheus.GaugeValue, n, p)
	}
	for c, n := range classes {
		ch <- prometheus.MustNewConstMetric(m.evacuators, prometheus.GaugeValue, n, c)
	}
}
