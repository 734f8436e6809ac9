package evacuation

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// Metrics are the Evacuation controller's metrics.
type Metrics struct {
	evictions   *prometheus.CounterVec
	evacuators  *prometheus.GaugeVec
	evacuations *prometheus.GaugeVec
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ebb_evacuation_evictions_total", Help: "Eviction API calls by result: evicted, blocked (a PodDisruptionBudget said no), gone, error.",
		}, []string{"result"}),
		evacuators: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ebb_evacuation_active_evacuators", Help: "Evacuations by active evacuator class.",
		}, []string{"class"}),
		evacuations: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ebb_evacuation_evacuations", Help: "Evacuations by phase: Pending (no evacuator yet), Evacuating (an evacuator is active), Evicting (the Eviction API fallback).",
		}, []string{"phase"}),
	}
	for _, c := range []prometheus.Collector{m.evictions, m.evacuators, m.evacuations} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering evacuation metrics: %w", err)
		}
	}
	return m, nil
}

// refresh recomputes the gauges from the cache.
func (m *Metrics) refresh(ctx context.Context, c client.Reader) {
	var list v1alpha1.EvacuationList
	if err := c.List(ctx, &list); err != nil {
		return
	}
	m.evacuators.Reset()
	m.evacuations.Reset()
	for _, p := range []string{PhasePending, PhaseEvacuating, PhaseEvicting} {
		m.evacuations.WithLabelValues(p).Set(0)
	}
	for i := range list.Items {
		e := &list.Items[i]
		m.evacuations.WithLabelValues(Phase(e)).Inc()
		if e.Status.ActiveEvacuatorClass != "" {
			m.evacuators.WithLabelValues(e.Status.ActiveEvacuatorClass).Inc()
		}
	}
}
