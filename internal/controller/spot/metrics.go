package spot

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics count what the spot controller did with each PreemptScheduled
// Event it looked at.
type Metrics struct {
	events *prometheus.CounterVec
}

// Results of one PreemptScheduled Event.
const (
	resultTainted = "tainted"
	// resultHandled: the node is leaving already, or this Event (or a
	// later one) was acted on.
	resultHandled = "handled"
	// resultLastLBHost: not tainted, the node hosts the last serving ebb
	// lb; retried while the Event stands.
	resultLastLBHost = "held-last-lb-host"
)

// NewMetrics registers the spot controller's metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{events: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ebb_spot_preemption_events_total",
		Help: "PreemptScheduled Events about Nodes by what ebb did with them: tainted, handled (acted on already, or the node is leaving), held-last-lb-host (the node hosts the last serving ebb lb), " +
			"refused-namespace and refused-source (not from a trusted emitter: forged, or --spot-event-sources lacks it), refused-earlier-node (about an earlier node of the same name).",
	}, []string{"result"})}
	for _, r := range []string{resultTainted, resultHandled, resultLastLBHost, refusedNamespace, refusedSource, refusedEarlierNode} {
		m.events.WithLabelValues(r)
	}
	if err := reg.Register(m.events); err != nil {
		return nil, fmt.Errorf("registering spot metrics: %w", err)
	}
	return m, nil
}

func (m *Metrics) count(result string) {
	if m != nil {
		m.events.WithLabelValues(result).Inc()
	}
}
