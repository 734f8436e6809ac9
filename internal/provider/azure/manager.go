package azure

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"github.com/prometheus/client_golang/prometheus"
)

// Node is what identifies a node's entries in backend pools: its
// addresses (IP-based pools, both families) and its provider ID (NIC-based
// pools: the NIC IP configurations of a scale-set VM sit under it; a NIC
// named after the node also matches).
type Node struct {
	Name       string
	IPs        []string
	ProviderID string
}

// conflictRetries bounds the fresh-read retries after an etag conflict,
// and the retries of a throttled write.
const conflictRetries = 3

// Manager sets the admin state of nodes' backend address entries on every
// load balancer of the cluster.
type Manager struct {
	cfg   *Config
	pools *armnetwork.LoadBalancerBackendAddressPoolsClient
	m     *Metrics

	// ThrottleBackoff is the wait after a 429 without Retry-After,
	// doubled per attempt. Default 1 s.
	ThrottleBackoff time.Duration

	mu sync.Mutex
	// applied is the last state written per node name.
	applied map[string]armnetwork.LoadBalancerBackendAddressAdminState
}

// NewManager returns a Manager using cred; opts may carry a test
// transport.
func NewManager(cfg *Config, cred azcore.TokenCredential, opts *arm.ClientOptions, m *Metrics) (*Manager, error) {
	if opts == nil {
		opts = &arm.ClientOptions{}
	}
	pools, err := armnetwork.NewLoadBalancerBackendAddressPoolsClient(cfg.SubscriptionID, cred, opts)
	if err != nil {
		return nil, fmt.Errorf("creating the backend address pools client: %w", err)
	}
	return &Manager{cfg: cfg, pools: pools, m: m, applied: map[string]armnetwork.LoadBalancerBackendAddressAdminState{}}, nil
}

// Forget drops a node from the cache (deleted, or replaced: the next call
// writes whatever its new entries need).
func (m *Manager) Forget(node string) {
	m.mu.Lock()
	delete(m.applied, node)
	m.mu.Unlock()
}

// Invalidate empties the cache, so the next call reads and writes afresh.
func (m *Manager) Invalidate() {
	m.mu.Lock()
	m.applied = map[string]armnetwork.LoadBalancerBackendAddressAdminState{}
	m.mu.Unlock()
}

// SetAdminStates sets each node's entries to its state, on every pool of
// every load balancer: a fresh read per pool, one write per pool that
// changes (several nodes in one call), none when nothing changes. On
// failure the previous state stays and the error says which pools failed.
func (m *Manager) SetAdminStates(ctx context.Context, want map[*Node]armnetwork.LoadBalancerBackendAddressAdminState) error {
	start := time.Now()
	todo := map[*Node]armnetwork.LoadBalancerBackendAddressAdminState{}
	m.mu.Lock()
	for n, s := range want {
		if last, ok := m.applied[n.Name]; !ok || last != s {
			todo[n] = s
		}
	}
	m.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	var errs []error
	for _, lb := range m.cfg.LoadBalancerNames() {
		pager := m.pools.NewListPager(m.cfg.LoadBalancerResourceGroup, lb, nil)
		for pager.More() {
			page, err := pager.NextPage(ctx)
			if err != nil {
				errs = append(errs, fmt.Errorf("listing the backend pools of load balancer %s: %w", lb, err))
				break
			}
			for _, pool := range page.Value {
				if err := m.updatePool(ctx, lb, pool, todo); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	err := errors.Join(errs...)
	m.m.observe(time.Since(start), err)
	if err != nil {
		return err
	}
	m.mu.Lock()
	for n, s := range todo {
		m.applied[n.Name] = s
	}
	m.mu.Unlock()
	return nil
}

// updatePool writes one pool if any of its entries must change, retrying
// an etag conflict with a fresh read.
func (m *Manager) updatePool(ctx context.Context, lb string, pool *armnetwork.BackendAddressPool, want map[*Node]armnetwork.LoadBalancerBackendAddressAdminState) error {
	name := deref(pool.Name)
	for attempt := 0; ; attempt++ {
		if !m.apply(pool, want) {
			return nil
		}
		poller, err := m.pools.BeginCreateOrUpdate(ctx, m.cfg.LoadBalancerResourceGroup, lb, name, *pool, nil)
		if err == nil {
			_, err = poller.PollUntilDone(ctx, &runtime.PollUntilDoneOptions{Frequency: time.Second})
		}
		if err == nil {
			return nil
		}
		var rerr *azcore.ResponseError
		if !errors.As(err, &rerr) || attempt >= conflictRetries {
			return fmt.Errorf("updating backend pool %s of load balancer %s: %w", name, lb, err)
		}
		switch rerr.StatusCode {
		case http.StatusPreconditionFailed:
		case http.StatusTooManyRequests:
			m.m.throttle()
			if err := sleepCtx(ctx, m.retryAfter(rerr, attempt)); err != nil {
				return err
			}
		default:
			return fmt.Errorf("updating backend pool %s of load balancer %s: %w", name, lb, err)
		}
		fresh, err := m.pools.Get(ctx, m.cfg.LoadBalancerResourceGroup, lb, name, nil)
		if err != nil {
			return fmt.Errorf("re-reading backend pool %s of load balancer %s after a conflict: %w", name, lb, err)
		}
		pool = &fresh.BackendAddressPool
	}
}

// apply sets the entries of the wanted nodes in pool; it reports whether
// anything changed.
func (m *Manager) apply(pool *armnetwork.BackendAddressPool, want map[*Node]armnetwork.LoadBalancerBackendAddressAdminState) bool {
	if pool.Properties == nil {
		return false
	}
	changed := false
	for _, entry := range pool.Properties.LoadBalancerBackendAddresses {
		if entry == nil || entry.Properties == nil {
			continue
		}
		for n, s := range want {
			if !m.owns(n, entry.Properties) {
				continue
			}
			if cur := entry.Properties.AdminState; cur == nil && s == armnetwork.LoadBalancerBackendAddressAdminStateNone || cur != nil && *cur == s {
				continue
			}
			state := s
			entry.Properties.AdminState = &state
			changed = true
		}
	}
	return changed
}

// owns reports whether a backend address entry is the node's.
func (m *Manager) owns(n *Node, p *armnetwork.LoadBalancerBackendAddressPropertiesFormat) bool {
	if p.IPAddress != nil && slices.Contains(n.IPs, *p.IPAddress) {
		return true
	}
	if p.NetworkInterfaceIPConfiguration == nil || p.NetworkInterfaceIPConfiguration.ID == nil {
		return false
	}
	id := strings.ToLower(*p.NetworkInterfaceIPConfiguration.ID)
	if pid := strings.ToLower(strings.TrimPrefix(n.ProviderID, "azure://")); pid != "" && strings.HasPrefix(id, pid+"/networkinterfaces/") {
		return true
	}
	return strings.Contains(id, "/networkinterfaces/"+strings.ToLower(n.Name)+"/") || strings.Contains(id, "/networkinterfaces/"+strings.ToLower(n.Name)+"-nic")
}

// retryAfter is how long to wait after a 429: its Retry-After, else an
// exponential backoff.
func (m *Manager) retryAfter(rerr *azcore.ResponseError, attempt int) time.Duration {
	if rerr.RawResponse != nil {
		if secs, err := strconv.Atoi(rerr.RawResponse.Header.Get("Retry-After")); err == nil && secs >= 0 {
			return min(time.Duration(secs)*time.Second, time.Minute)
		}
	}
	base := m.ThrottleBackoff
	if base <= 0 {
		base = time.Second
	}
	return base << attempt
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Metrics, with the design's prefix loadbalancer_adminstate.
type Metrics struct {
	latency   prometheus.Histogram
	errors    prometheus.Counter
	throttled prometheus.Counter
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "loadbalancer_adminstate_operation_duration_seconds",
			Help: "Time to set nodes' admin state on every Azure load balancer of the cluster.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "loadbalancer_adminstate_errors_total",
			Help: "Admin state operations that failed."}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{Name: "loadbalancer_adminstate_throttled_total",
			Help: "Throttled (429) admin state writes that reached ebb after the SDK's own retries; ebb waits Retry-After (or backs off) and retries."}),
	}
	for _, c := range []prometheus.Collector{m.latency, m.errors, m.throttled} {
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
