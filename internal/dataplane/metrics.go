package dataplane

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the data plane's Prometheus metrics (prefix ebb_dataplane_).
type metrics struct {
	connsActive      *prometheus.GaugeVec
	connsTotal       *prometheus.CounterVec
	bytes            *prometheus.CounterVec
	dialErrors       *prometheus.CounterVec
	refused          *prometheus.CounterVec
	adminState       *prometheus.GaugeVec
	probeUp          *prometheus.GaugeVec
	probeTransitions *prometheus.CounterVec
	udpMigrations    *prometheus.CounterVec
	udpFlows         prometheus.Gauge
	autoFallback     prometheus.Gauge
	applySeconds     prometheus.Histogram
	skipped          *prometheus.GaugeVec
	engines          *prometheus.GaugeVec
	// engineSeries is the series engines has, by frontend name (only
	// Apply, under the data plane's lock, reads or writes it).
	engineSeries     map[string]engineSeries
	kernelSyncs      *prometheus.HistogramVec
	kernelFailures   prometheus.Counter
	kernelReused     prometheus.Counter
	inheritedSockets prometheus.Counter
	bpfElements      *prometheus.GaugeVec
	bpfSize          *prometheus.GaugeVec
}

var backendLabels = []string{"frontend", "backend", "owner"}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connsActive: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ebb_dataplane_connections_active", Help: "Established TCP connections (and live UDP flows) per backend.",
		}, backendLabels),
		connsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ebb_dataplane_connections_total", Help: "TCP connections (and UDP flows) proxied to each backend.",
		}, backendLabels),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ebb_dataplane_bytes_total", Help: "Bytes proxied per backend; direction is to_backend or to_client.",
		}, append(backendLabels, "direction")),
		dialErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ebb_dataplane_dial_errors_total", Help: "Failed connection attempts to each backend.",
		}, backendLabels),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ebb_dataplane_refused_total", Help: "Client connections (UDP: new flows) refused by a frontend; reason is no_backend, source_range, hold_limit (too many connections held while their backends refuse), or a limit of UDP flows: udp_flows_total, udp_flows_frontend, udp_flows_source.",
		}, []string{"frontend", "reason"}),
		adminState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ebb_dataplane_backend_admin_state", Help: "1 for the backend's current admin state (None, Down, Up).",
		}, append(backendLabels, "state")),
		probeUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ebb_dataplane_probe_up", Help: "1 while a health probe target is healthy, 0 while not.",
		}, []string{"target", "protocol"}),
		probeTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ebb_dataplane_probe_transitions_total", Help: "Health transitions of probe targets; to is up or down.",
		}, []string{"target", "protocol", "to"}),
		udpMigrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ebb_dataplane_udp_flow_migrations_total", Help: "UDP flows moved off a backend that became ineligible.",
		}, []string{"frontend"}),
		autoFallback: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ebb_dataplane_kernel_auto_fallback", Help: "1 once the kernel path failed under a frontend of engine Auto: Auto gives every frontend to the proxy until ebb lb restarts.",
		}),
		udpFlows: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ebb_dataplane_udp_flows", Help: "UDP flows the proxy engine holds, on every frontend (bounded by ebb lb --udp-flows).",
		}),
		applySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ebb_dataplane_apply_duration_seconds",
			Help:    "Time from a configuration apply to its taking effect for new connections.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10),
		}),
		skipped: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ebb_dataplane_frontend_skipped",
			Help: "1 for each frontend the last apply could not serve; reason is Invalid, AddressConflict, ListenFailed, KernelFailed or KernelFull.",
		}, []string{"frontend", "reason"}),
		engines: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ebb_dataplane_frontend_engine",
			Help: "1 for each frontend served, by the engine that serves it (Proxy or Kernel) and, for Kernel, its path (nftables or ebpf).",
		}, []string{"frontend", "engine", "path"}),
		kernelSyncs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ebb_dataplane_kernel_sync_duration_seconds",
			Help:    "nftables transactions of the kernel engine; kind is rebuild (whole tables), entries (map entries: probes, and the entries prepared for the next change) or owners (only nodes' states: the admin-state fast path).",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 12),
		}, []string{"kind"}),
		kernelFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ebb_dataplane_kernel_sync_failures_total", Help: "nftables transactions of the kernel engine that failed (the previous tables stay).",
		}),
		kernelReused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ebb_dataplane_kernel_reused_ports_total", Help: "Conntrack entries the nftables path deleted because a client opened a connection from the port of a flow whose end this host never saw (the client's retransmitted SYN then opens a new flow).",
		}),
		inheritedSockets: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ebb_dataplane_inherited_sockets_total", Help: "Frontend sockets served that a predecessor process handed over, instead of opened anew.",
		}),
		bpfElements: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ebb_dataplane_bpf_map_elements", Help: "Elements the eBPF kernel path's fixed-size maps hold after its last sync (frontends, homes, backends, ranges, owners); compare with ebb_dataplane_bpf_map_size.",
		}, []string{"map"}),
		bpfSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ebb_dataplane_bpf_map_size", Help: "The most elements each of the eBPF kernel path's maps holds; a frontend that does not fit is not served (ebb_dataplane_frontend_skipped reason KernelFull).",
		}, []string{"map"}),
	}
	for _, c := range []prometheus.Collector{m.connsActive, m.connsTotal, m.bytes, m.dialErrors, m.refused, m.adminState, m.probeUp, m.probeTransitions, m.udpMigrations, m.udpFlows, m.autoFallback, m.applySeconds, m.skipped, m.engines, m.kernelSyncs, m.kernelFailures, m.kernelReused, m.inheritedSockets, m.bpfElements, m.bpfSize} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// registerEBPFMetrics registers the eBPF kernel path's counters, which
// its program keeps and the path reads at each scrape.
func registerEBPFMetrics(reg prometheus.Registerer, e *ebpfPath) error {
	return reg.Register(ebpfCounters{e})
}

// ebpfCounters collects the program's counters. It exports nothing until
// the path has loaded its maps: they are pinned, so the first value is
// the total since they were made, and a series that went from 0 to that
// total at each restart would look like an increase to alerts.
type ebpfCounters struct{ e *ebpfPath }

var bpfSourcePortsExhausted = prometheus.NewDesc("ebb_dataplane_bpf_source_ports_exhausted_total",
	"New TCP connections the eBPF kernel path dropped because every source port they tried toward their backend was held by an open flow (33,512 ports per backend and LB host address; a half-open flow whose client has been silent for 1 s gives its port to a new flow). The client retries its SYN. Counted since the path's maps were made (they outlive restarts); no series until they are loaded.",
	nil, nil)

func (c ebpfCounters) Describe(ch chan<- *prometheus.Desc) { ch <- bpfSourcePortsExhausted }

func (c ebpfCounters) Collect(ch chan<- prometheus.Metric) {
	if n, ok := c.e.sourcePortsExhausted(); ok {
		ch <- prometheus.MustNewConstMetric(bpfSourcePortsExhausted, prometheus.CounterValue, n)
	}
}

// backendMetrics are one backend's series, resolved once so the hot path
// only does atomic adds.
type backendMetrics struct {
	active     prometheus.Gauge
	total      prometheus.Counter
	toBackend  prometheus.Counter
	toClient   prometheus.Counter
	dialErrors prometheus.Counter
	// admin holds the admin state gauges, in the order None, Down, Up.
	admin  [3]prometheus.Gauge
	labels []string
}

var adminStates = [3]AdminState{AdminNone, AdminDown, AdminUp}

func (m *metrics) forBackend(frontend string, b Backend) backendMetrics {
	l := []string{frontend, b.AddrPort().String(), b.Owner}
	bm := backendMetrics{
		active:     m.connsActive.WithLabelValues(l...),
		total:      m.connsTotal.WithLabelValues(l...),
		toBackend:  m.bytes.WithLabelValues(append(l, "to_backend")...),
		toClient:   m.bytes.WithLabelValues(append(l, "to_client")...),
		dialErrors: m.dialErrors.WithLabelValues(l...),
		labels:     l,
	}
	for i, s := range adminStates {
		bm.admin[i] = m.adminState.WithLabelValues(append(l, string(s))...)
	}
	return bm
}

// setAdminState publishes a backend's admin state.
func (bm backendMetrics) setAdminState(state adminState) {
	for i, g := range bm.admin {
		v := 0.0
		if adminState(i) == state {
			v = 1
		}
		g.Set(v)
	}
}

// forget deletes a removed backend's series.
func (m *metrics) forget(bm backendMetrics) {
	m.connsActive.DeleteLabelValues(bm.labels...)
	m.connsTotal.DeleteLabelValues(bm.labels...)
	m.dialErrors.DeleteLabelValues(bm.labels...)
	for _, d := range []string{"to_backend", "to_client"} {
		m.bytes.DeleteLabelValues(append(bm.labels, d)...)
	}
	for _, s := range adminStates {
		m.adminState.DeleteLabelValues(append(bm.labels, string(s))...)
	}
}

// setSkipped replaces the skipped-frontend series with the last apply's.
func (m *metrics) setSkipped(skipped []SkippedFrontend) {
	m.skipped.Reset()
	for _, s := range skipped {
		m.skipped.WithLabelValues(s.Name, string(s.Reason)).Set(1)
	}
}

// setEngines replaces the frontend-engine series with the frontends the
// last apply serves (those not skipped), and how.
// Only the series that change are touched: an apply that changes no
// frontend's engine (most of them) allocates nothing here, and a scrape
// never sees the series missing.
func (m *metrics) setEngines(frontends []Frontend, skipped []SkippedFrontend, path KernelPath) {
	out := make(map[string]bool, len(skipped))
	for _, s := range skipped {
		out[s.Name] = true
	}
	want := make(map[string]engineSeries, len(frontends))
	for _, f := range frontends {
		if out[f.Name] {
			continue
		}
		e := engineSeries{engine: string(f.Engine)}
		if f.Engine == EngineKernel {
			e.path = string(path)
		}
		want[f.Name] = e
	}
	for name, e := range m.engineSeries {
		if want[name] != e {
			m.engines.DeleteLabelValues(name, e.engine, e.path)
		}
	}
	for name, e := range want {
		if m.engineSeries[name] != e {
			m.engines.WithLabelValues(name, e.engine, e.path).Set(1)
		}
	}
	m.engineSeries = want
}

// engineSeries is the labels of a frontend's series of
// ebb_dataplane_frontend_engine besides its name.
type engineSeries struct{ engine, path string }
