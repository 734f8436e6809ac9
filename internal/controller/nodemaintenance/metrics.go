package nodemaintenance

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// Metrics are the controller's Prometheus metrics.
type Metrics struct {
	maintenances *prometheus.GaugeVec
	pods         *prometheus.GaugeVec
	stageSeconds *prometheus.HistogramVec
	// trafficTimeouts counts nodes whose traffic drain gave up on
	// established connections (the alert EbbTrafficDrainTimedOut).
	trafficTimeouts prometheus.Counter
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		maintenances: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ebb_nodemaintenance_maintenances", Help: "NodeMaintenances by stage.",
		}, []string{"stage"}),
		pods: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ebb_nodemaintenance_pods", Help: "Pods on a maintenance's nodes: state is pending (no Evacuation yet) or evacuating.",
		}, []string{"nodemaintenance", "state"}),
		stageSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ebb_nodemaintenance_stage_duration_seconds", Help: "How long a maintenance stayed in a stage.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10),
		}, []string{"stage"}),
		trafficTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ebb_nodemaintenance_traffic_drain_timeouts_total",
			Help: "Nodes (LB hosts among them) whose traffic drain reached the maintenance's trafficDrainTimeoutSeconds with established connections left, which the drain then no longer waits for (Warning TrafficDrainTimeout names the node).",
		}),
	}
	for _, c := range []prometheus.Collector{m.maintenances, m.pods, m.stageSeconds, m.trafficTimeouts} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering node maintenance metrics: %w", err)
		}
	}
	// Every stage at 0 until a maintenance is counted: a cluster without
	// maintenances shows zeros, not "no data" (the dashboard's panel).
	m.observeStages(nil)
	return m, nil
}

func (m *Metrics) observeStages(nms []v1alpha1.NodeMaintenance) {
	counts := map[v1alpha1.NodeMaintenanceStage]float64{v1alpha1.Idle: 0, v1alpha1.Cordon: 0, v1alpha1.Drain: 0, v1alpha1.Complete: 0}
	for _, nm := range nms {
		counts[nm.Spec.Stage]++
	}
	for s, n := range counts {
		m.maintenances.WithLabelValues(string(s)).Set(n)
	}
}

func (m *Metrics) setPods(name string, statuses []v1alpha1.NodeMaintenanceNodeStatus) {
	var pending, evacuating int32
	for _, s := range statuses {
		pending += s.PodsPendingEvacuation
		evacuating += s.PodsEvacuating
	}
	m.pods.WithLabelValues(name, "pending").Set(float64(pending))
	m.pods.WithLabelValues(name, "evacuating").Set(float64(evacuating))
}

// trafficDrainTimedOut counts a node whose traffic drain timed out; a nil
// Metrics counts nothing.
func (m *Metrics) trafficDrainTimedOut() {
	if m != nil {
		m.trafficTimeouts.Inc()
	}
}

// forget drops a maintenance's pod counts; a nil Metrics has none.
func (m *Metrics) forget(name string) {
	if m == nil {
		return
	}
	m.pods.DeletePartialMatch(prometheus.Labels{"nodemaintenance": name})
}
