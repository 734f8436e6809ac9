package lbsync

import "github.com/prometheus/client_golang/prometheus"

// syncMetrics are the full sync's.
type syncMetrics struct {
	seconds     prometheus.Histogram
	frontends   prometheus.Gauge
	unannounced prometheus.Gauge
	cutOff      prometheus.Gauge
}

func newSyncMetrics() syncMetrics {
	return syncMetrics{
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ebb_lbsync_sync_duration_seconds",
			Help:    "Time to compute the whole load balancer configuration from the cluster and apply it.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		frontends: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ebb_lbsync_frontends", Help: "Frontends served from the cluster's Services."}),
		unannounced: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ebb_lb_unannounced_addresses",
			Help: "Load-balancer addresses served here that a way of announcing meant for them (BGP, L2) cannot announce (Warning AddressNotAnnounced on their Services)."}),
		cutOff: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ebb_lb_api_cut_off",
			Help: "1 while this replica could write no report for one and a half heartbeats (it cannot reach the API server): its own node's backends are then admin Down wherever another node can take their new connections (with --disable-admin-state, counted only)."}),
	}
}

func (m syncMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.seconds, m.frontends, m.unannounced, m.cutOff}
}

// adminMetrics are the admin-state fast path's.
type adminMetrics struct {
	transitions *prometheus.CounterVec
	errors      prometheus.Counter
	latency     prometheus.Histogram
	appliedAt   *prometheus.GaugeVec
}

func newAdminMetrics() adminMetrics {
	return adminMetrics{
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ebb_lb_admin_state_transitions_total",
			Help: "Admin state changes applied to a node's backends by the fast path; state is Down or None.",
		}, []string{"state"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ebb_lb_admin_state_errors_total",
			Help: "Admin state changes the fast path could not apply (each attempt).",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ebb_lb_admin_state_apply_seconds",
			Help:    "Time from a node's taint change being observed to its backends' admin state being applied.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10),
		}),
		// When, not how long: the one figure that can be compared with
		// an event outside the process (the taint's API write, a
		// client's last connection) on the same clock.
		appliedAt: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ebb_lb_admin_state_applied_timestamp_seconds",
			Help: "Unix time at which the fast path last applied a node's admin state to its backends.",
		}, []string{"node", "state"}),
	}
}

func (m adminMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.transitions, m.errors, m.latency, m.appliedAt}
}
