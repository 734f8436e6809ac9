// Package nodehealth is the node health server of KEP-3836: load balancers
// probe GET /healthz on each node (kube-proxy's port 10256) to learn whether
// to send the node traffic, and GET /livez whether the process lives.
//
// /healthz fails (503) once the node is being deleted or carries a leaving
// signal (lbmodel.IsLeaving: ToBeDeletedByClusterAutoscaler as kube-proxy,
// and every other configured taint or label, Karpenter's and medik8s' by
// default), so load balancers stop sending it new connections before the
// node goes, whichever tool removes it; /livez keeps the old
// process-only meaning and always succeeds while the server runs. When the
// node cannot be read (a watch error), the last known state stays; a server
// that has not read its node yet starts from the state it last saved, or
// as eligible: an agent restarted while the API server is unreachable must
// not fail every node's health check at once, the outage KEP-3836 warns of.
package nodehealth

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

// KubeProxyPort is kube-proxy's health port, which load balancers probe by
// default.
const KubeProxyPort = 10256

// AgentPort is `ebb node-agent`'s default: one no Kubernetes component
// uses, so it runs beside kube-proxy.
const AgentPort = 10266

// Server answers one node's health questions.
type Server struct {
	clock clock.PassiveClock
	model lbmodel.Options

	mu          sync.Mutex
	eligible    bool
	known       bool
	lastUpdated time.Time

	healthz *prometheus.CounterVec
	livez   *prometheus.CounterVec
	knownG  prometheus.Gauge
	// save, if set, keeps the state for a restart (SaveTo); saved is the
	// eligibility last saved, nil until a save succeeded (a failed save is
	// tried again at the next update of the node).
	save  func(State) error
	saved *bool
}

// State is what a server knows of its node, as saved for a restart.
type State struct {
	Eligible    bool      `json:"eligible"`
	LastUpdated time.Time `json:"lastUpdated"`
}

// Metrics are the server's request counters, labelled by HTTP code, as
// KEP-3836 asks (kube-proxy names them
// proxy_healthz_total and proxy_livez_total).
type Metrics struct {
	Healthz *prometheus.CounterVec
	Livez   *prometheus.CounterVec
	// Known is 1 once the node has been read since the start, 0 while the
	// answers come from the saved state or the eligible default.
	Known prometheus.Gauge
}

// NewMetrics creates and registers the counters.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Healthz: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ebb_node_healthz_total", Help: "Answers to /healthz by HTTP code."}, []string{"code"}),
		Livez:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ebb_node_livez_total", Help: "Answers to /livez by HTTP code."}, []string{"code"}),
		Known: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ebb_node_state_known",
			Help: "1 once the agent has read its Node since it started; 0 while /healthz answers from the state saved before a restart, or as eligible when there is none."}),
	}
	for _, c := range []prometheus.Collector{m.Healthz, m.Livez, m.Known} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// New returns a Server that has not read its node yet: it answers as
// eligible until Restore or SetNode says otherwise. model says which
// signals make the node leaving (the same as the load balancers').
func New(m *Metrics, clk clock.PassiveClock, model lbmodel.Options) *Server {
	if clk == nil {
		clk = clock.RealClock{}
	}
	m.Known.Set(0)
	return &Server{clock: clk, model: model, healthz: m.Healthz, livez: m.Livez, knownG: m.Known, eligible: true}
}

// Restore starts from a state saved before a restart, until the node is
// read. It does nothing once the node has been read.
func (s *Server) Restore(st State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.known {
		s.eligible, s.lastUpdated = st.Eligible, st.LastUpdated
	}
}

// SaveTo makes the server call save with its state each time the node's
// eligibility changes (not at every update of the node).
func (s *Server) SaveTo(save func(State) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.save, s.saved = save, nil
}

// Eligible reports whether a node should receive load-balancer traffic:
// not being deleted and not leaving. Cordon alone keeps it eligible.
func Eligible(node *corev1.Node, model lbmodel.Options) bool {
	if node.DeletionTimestamp != nil {
		return false
	}
	leaving, _ := lbmodel.IsLeaving(node, model)
	return !leaving
}

// SetNode records the node's latest state. A nil node (deleted) makes it
// ineligible.
// An error saving the state is returned; the state in memory is set.
func (s *Server) SetNode(node *corev1.Node) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	eligible := node != nil && Eligible(node, s.model)
	s.known, s.eligible, s.lastUpdated = true, eligible, s.clock.Now()
	s.knownG.Set(1)
	if s.save == nil || s.saved != nil && *s.saved == eligible {
		return nil
	}
	if err := s.save(State{Eligible: eligible, LastUpdated: s.lastUpdated}); err != nil {
		s.saved = nil
		return err
	}
	s.saved = &eligible
	return nil
}

// answer is the JSON body of both endpoints, field for field kube-proxy's
// (pkg/proxy/healthcheck.ProxyHealth in v1.36), so that a load balancer or
// a person reading kube-proxy's answers reads ebb's the same way. Healthy
// is kube-proxy's data-plane health; the agent has no data plane, so it is
// always true (the process answers). kube-proxy's per-family "status"
// is left out (it is omitempty there too).
type answer struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible,omitempty"`
	Healthy      bool      `json:"healthy"`
}

// Handler serves /healthz and /livez.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		eligible, last := s.eligible, s.lastUpdated
		s.mu.Unlock()
		s.write(w, eligible, s.healthz, answer{LastUpdated: last, NodeEligible: &eligible, Healthy: true})
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		last := s.lastUpdated
		s.mu.Unlock()
		s.write(w, true, s.livez, answer{LastUpdated: last, Healthy: true})
	})
	return mux
}

// write answers 200 when ok, else 503, as kube-proxy does: same headers,
// the body without a trailing newline, and lastUpdated set to now when
// healthy (kube-proxy keeps that for compatibility with old releases,
// whose lastUpdated was the last sync, always recent on a healthy proxy).
func (s *Server) write(w http.ResponseWriter, ok bool, counter *prometheus.CounterVec, a answer) {
	now := s.clock.Now()
	a.CurrentTime = now
	code := http.StatusServiceUnavailable
	if ok {
		code, a.LastUpdated = http.StatusOK, now
	}
	body, err := json.Marshal(a)
	if err != nil {
		http.Error(w, fmt.Sprintf("encoding the answer: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(body)
	counter.WithLabelValues(strconv.Itoa(code)).Inc()
}
