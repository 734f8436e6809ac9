// Package nodehealth is the node health server of KEP-3836: load balancers
// probe GET /healthz on each node (kube-proxy's port 10256) to learn whether
// to send the node traffic, and GET /livez whether the process lives.
//
// /healthz fails (503) once the node is being deleted or tainted
// ToBeDeletedByClusterAutoscaler, so load balancers stop sending it new
// connections before the autoscaler removes it; /livez keeps the old
// process-only meaning and always succeeds while the server runs. When the
// node cannot be read (a watch error), the last known state stays.
package nodehealth

import (
	"encoding/json"
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

	mu          sync.Mutex
	eligible    bool
	known       bool
	lastUpdated time.Time

	healthz *prometheus.CounterVec
	livez   *prometheus.CounterVec
}

// Metrics are the server's request counters, labelled by HTTP code, as
// KEP-3836 asks (kube-proxy names them
// proxy_healthz_total and proxy_livez_total).
type Metrics struct {
	Healthz *prometheus.CounterVec
	Livez   *prometheus.CounterVec
}

// NewMetrics creates and registers the counters.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Healthz: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ebb_node_healthz_total", Help: "Answers to /healthz by HTTP code."}, []string{"code"}),
		Livez:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ebb_node_livez_total", Help: "Answers to /livez by HTTP code."}, []string{"code"}),
	}
	for _, c := range []prometheus.Collector{m.Healthz, m.Livez} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// New returns a Server that knows nothing of its node yet (/healthz fails
// until SetNode is called).
func New(m *Metrics, clk clock.PassiveClock) *Server {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Server{clock: clk, healthz: m.Healthz, livez: m.Livez}
}

// Eligible reports whether a node should receive load-balancer traffic:
// not being deleted and not tainted for deletion by the autoscaler.
func Eligible(node *corev1.Node) bool {
	if node.DeletionTimestamp != nil {
		return false
	}
	for _, t := range node.Spec.Taints {
		if t.Key == lbmodel.TaintToBeDeleted {
			return false
		}
	}
	return true
}

// SetNode records the node's latest state. A nil node (deleted) makes it
// ineligible.
func (s *Server) SetNode(node *corev1.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.known = true
	s.eligible = node != nil && Eligible(node)
	s.lastUpdated = s.clock.Now()
}

// answer is the JSON body of both endpoints, kube-proxy's shape.
type answer struct {
	LastUpdated  string `json:"lastUpdated"`
	CurrentTime  string `json:"currentTime"`
	NodeEligible *bool  `json:"nodeEligible,omitempty"`
}

// Handler serves /healthz and /livez.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		eligible, known, last := s.eligible, s.known, s.lastUpdated
		s.mu.Unlock()
		code := http.StatusOK
		if !known || !eligible {
			code = http.StatusServiceUnavailable
		}
		s.write(w, code, s.healthz, answer{LastUpdated: stamp(last), CurrentTime: stamp(s.clock.Now()), NodeEligible: &eligible})
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		last := s.lastUpdated
		s.mu.Unlock()
		s.write(w, http.StatusOK, s.livez, answer{LastUpdated: stamp(last), CurrentTime: stamp(s.clock.Now())})
	})
	return mux
}

func (s *Server) write(w http.ResponseWriter, code int, counter *prometheus.CounterVec, a answer) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(a)
	counter.WithLabelValues(strconv.Itoa(code)).Inc()
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}
