package azure

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics: the design asks for the operation metrics cloud-provider-azure
// already exports, with a dedicated prefix, so that the series operations
// teams watch carry the admin-state calls too. Each Azure call is observed
// in cloud-provider-azure's own series and labels
// (cloudprovider_azure_api_request_*{request, resource_group,
// subscription_id, source, result_code}) with request
// "loadbalancer_adminstate_<call>" and source "ebb-adminstate"; the whole
// operation (every pool of every load balancer) in
// loadbalancer_adminstate_*.
type Metrics struct {
	latency   prometheus.Histogram
	errors    prometheus.Counter
	throttled prometheus.Counter
	unmatched prometheus.Gauge

	requestLatency   *prometheus.HistogramVec
	requestErrors    *prometheus.CounterVec
	requestThrottled *prometheus.CounterVec
}

// Request names, after the prefix.
const (
	requestList   = "list_backend_pools"
	requestGet    = "get_backend_pool"
	requestUpdate = "update_backend_pool"
)

// metricsSource is the source label of ebb's calls.
const metricsSource = "ebb-adminstate"

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	labels := []string{"request", "resource_group", "subscription_id", "source"}
	m := &Metrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "loadbalancer_adminstate_operation_duration_seconds",
			Help: "Time to set nodes' admin state on every Azure load balancer of the cluster.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "loadbalancer_adminstate_errors_total",
			Help: "Admin state operations that failed."}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{Name: "loadbalancer_adminstate_throttled_total",
			Help: "Throttled (429) admin state writes that reached ebb after the SDK's own retries; ebb waits Retry-After (or backs off) and retries."}),
		unmatched: prometheus.NewGauge(prometheus.GaugeOpts{Name: "loadbalancer_adminstate_unmatched_nodes",
			Help: "Nodes to be set Down that no backend pool entry matches, at the last operation: their new connections cannot be stopped."}),
		requestLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "cloudprovider_azure_api_request_duration_seconds",
			Help: "Latency of an Azure API call (cloud-provider-azure's series; ebb's calls have source ebb-adminstate).", Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)},
			append(labels, "result_code")),
		requestErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cloudprovider_azure_api_request_errors",
			Help: "Azure API calls that failed (cloud-provider-azure's series; ebb's calls have source ebb-adminstate)."}, labels),
		requestThrottled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cloudprovider_azure_api_request_throttled_count",
			Help: "Azure API calls answered 429 (cloud-provider-azure's series; ebb's calls have source ebb-adminstate)."}, labels),
	}
	for _, c := range []prometheus.Collector{m.latency, m.errors, m.throttled, m.unmatched, m.requestLatency, m.requestErrors, m.requestThrottled} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) observe(d time.Duration, err error) {
	if m == nil {
		return
	}
	m.latency.Observe(d.Seconds())
	if err != nil {
		m.errors.Inc()
	}
}

func (m *Metrics) throttle() {
	if m != nil {
		m.throttled.Inc()
	}
}

func (m *Metrics) setUnmatched(n int) {
	if m != nil {
		m.unmatched.Set(float64(n))
	}
}

// call observes one Azure API call as cloud-provider-azure does.
func (m *Metrics) call(cfg *Config, request string, start time.Time, resp *http.Response, err error) {
	if m == nil {
		return
	}
	labels := prometheus.Labels{"request": "loadbalancer_adminstate_" + request, "resource_group": strings.ToLower(cfg.LoadBalancerResourceGroup),
		"subscription_id": cfg.SubscriptionID, "source": metricsSource}
	code := 0
	if resp != nil {
		code = resp.StatusCode
	}
	var rerr *azcore.ResponseError
	if errors.As(err, &rerr) {
		code = rerr.StatusCode
	}
	if err != nil {
		m.requestErrors.With(labels).Inc()
		if code == http.StatusTooManyRequests {
			m.requestThrottled.With(labels).Inc()
		}
	}
	labels["result_code"] = strconv.Itoa(code)
	m.requestLatency.With(labels).Observe(time.Since(start).Seconds())
}
