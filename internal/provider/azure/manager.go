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
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// conflictRetries bounds the fresh-read retries after an etag conflict,
// and the retries of a throttled write.
const conflictRetries = 3

// State is a backend address entry's admin state.
type State = armnetwork.LoadBalancerBackendAddressAdminState

// The states ebb sets.
const (
	StateDown = armnetwork.LoadBalancerBackendAddressAdminStateDown
	StateNone = armnetwork.LoadBalancerBackendAddressAdminStateNone
)

// Manager sets the admin state of nodes' backend address entries on every
// load balancer of the cluster. Each load balancer converges on its own:
// one that fails (or does not exist yet) does not hold the others back.
type Manager struct {
	cfg   *Config
	pools *armnetwork.LoadBalancerBackendAddressPoolsClient
	m     *Metrics

	// ThrottleBackoff is the wait after a 429 without Retry-After,
	// doubled per attempt. Default 1 s.
	ThrottleBackoff time.Duration

	vms *armcompute.VirtualMachinesClient

	mu sync.Mutex
	// applied is, per load balancer, the state each node's entries last
	// converged to there.
	applied map[string]map[string]State
	// found are the nodes seen in some pool since the last Invalidate.
	found map[string]bool
	// nics caches the network interfaces of nodes on standalone VMs.
	nics map[string]vmNICs
	// skipped are the pools already logged as not ebb's to write.
	skipped map[string]bool
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
	vms, err := armcompute.NewVirtualMachinesClient(cfg.SubscriptionID, cred, opts)
	if err != nil {
		return nil, fmt.Errorf("creating the virtual machines client: %w", err)
	}
	return &Manager{cfg: cfg, pools: pools, vms: vms, m: m, applied: map[string]map[string]State{}, skipped: map[string]bool{},
		found: map[string]bool{}, nics: map[string]vmNICs{}}, nil
}

// Forget drops a node from the cache (deleted, or replaced: the next call
// writes whatever its new entries need).
func (m *Manager) Forget(node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, nodes := range m.applied {
		delete(nodes, node)
	}
	delete(m.found, node)
	delete(m.nics, node)
}

// Invalidate empties the cache, so the next call reads every load
// balancer afresh and rewrites whatever drifted.
func (m *Manager) Invalidate() {
	m.mu.Lock()
	m.applied = map[string]map[string]State{}
	m.found = map[string]bool{}
	m.mu.Unlock()
}

// SetAdminStates sets each node's entries to its state, on every managed
// pool of every load balancer: a fresh read per load balancer that has
// work, one write per pool that changes (several nodes in one call), none
// when nothing changes. A load balancer that does not exist has nothing to
// set. On failure the previous state stays there and the error says which
// load balancers and pools failed; the others are done and not redone.
func (m *Manager) SetAdminStates(ctx context.Context, want map[*Node]State) error {
	start := time.Now()
	var errs []error
	if err := m.resolveNICs(ctx, want); err != nil {
		errs = append(errs, err)
	}
	worked := false
	for _, lb := range m.cfg.AdminStateLoadBalancers() {
		todo := m.todo(lb, want)
		if len(todo) == 0 {
			continue
		}
		worked = true
		if err := m.setOn(ctx, lb, todo); err != nil {
			errs = append(errs, err)
			continue
		}
		m.mu.Lock()
		if m.applied[lb] == nil {
			m.applied[lb] = map[string]State{}
		}
		for n, s := range todo {
			m.applied[lb][n.Name] = s
		}
		m.mu.Unlock()
	}
	if !worked && len(errs) == 0 {
		return nil
	}
	err := errors.Join(errs...)
	if err == nil {
		err = m.unmatched(want)
	}
	m.m.observe(time.Since(start), err)
	return err
}

// todo are the nodes whose state on lb is not known to be the wanted one.
func (m *Manager) todo(lb string, want map[*Node]State) map[*Node]State {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[*Node]State{}
	for n, s := range want {
		if last, ok := m.applied[lb][n.Name]; !ok || last != s {
			out[n] = s
		}
	}
	return out
}

// setOn converges the nodes' entries on one load balancer.
func (m *Manager) setOn(ctx context.Context, lb string, todo map[*Node]State) error {
	var errs []error
	pager := m.pools.NewListPager(m.cfg.LoadBalancerResourceGroup, lb, nil)
	for pager.More() {
		var page armnetwork.LoadBalancerBackendAddressPoolsClientListResponse
		err := m.observed(ctx, requestList, func(ctx context.Context) (err error) {
			page, err = pager.NextPage(ctx)
			return err
		})
		if isNotFound(err) {
			// cloud-provider-azure creates a load balancer (the internal
			// one especially) with the first Service that needs it;
			// until then there is nothing to set.
			log.FromContext(ctx).V(1).Info("Load balancer does not exist: no admin state to set", "loadBalancer", lb)
			return nil
		}
		if err != nil {
			return fmt.Errorf("listing the backend pools of load balancer %s: %w", lb, err)
		}
		for _, pool := range page.Value {
			if !m.manages(ctx, lb, pool) {
				continue
			}
			if err := m.updatePool(ctx, lb, pool, todo); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// manages reports whether a pool is one of the node pools
// cloud-provider-azure keeps (the only ones ebb writes), logging the
// others once.
func (m *Manager) manages(ctx context.Context, lb string, pool *armnetwork.BackendAddressPool) bool {
	name := deref(pool.Name)
	if slices.ContainsFunc(m.cfg.BackendPoolNames(), func(n string) bool { return strings.EqualFold(n, name) }) {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if key := lb + "/" + name; !m.skipped[key] {
		m.skipped[key] = true
		log.FromContext(ctx).Info("Leaving a backend pool alone: not one of the cluster's node pools (an outbound-only or user pool)",
			"loadBalancer", lb, "pool", name, "nodePools", m.cfg.BackendPoolNames())
	}
	return false
}

// updatePool writes one pool if any of its entries must change, with its
// etag in If-Match (ARM ignores the etag in the body), retrying a
// conflict or a throttled write with a fresh read.
func (m *Manager) updatePool(ctx context.Context, lb string, pool *armnetwork.BackendAddressPool, want map[*Node]State) error {
	name := deref(pool.Name)
	for attempt := 0; ; attempt++ {
		if !m.apply(pool, want) {
			return nil
		}
		err := m.write(ctx, lb, name, pool)
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
		var fresh armnetwork.LoadBalancerBackendAddressPoolsClientGetResponse
		err = m.observed(ctx, requestGet, func(ctx context.Context) (err error) {
			fresh, err = m.pools.Get(ctx, m.cfg.LoadBalancerResourceGroup, lb, name, nil)
			return err
		})
		if err != nil {
			return fmt.Errorf("re-reading backend pool %s of load balancer %s after a conflict: %w", name, lb, err)
		}
		pool = &fresh.BackendAddressPool
	}
}

// write puts a pool, conditional on the etag it was read with.
func (m *Manager) write(ctx context.Context, lb, name string, pool *armnetwork.BackendAddressPool) error {
	if pool.Etag != nil {
		ctx = policy.WithHTTPHeader(ctx, http.Header{"If-Match": []string{*pool.Etag}})
	}
	return m.observed(ctx, requestUpdate, func(ctx context.Context) error {
		poller, err := m.pools.BeginCreateOrUpdate(ctx, m.cfg.LoadBalancerResourceGroup, lb, name, *pool, nil)
		if err == nil {
			_, err = poller.PollUntilDone(ctx, &runtime.PollUntilDoneOptions{Frequency: time.Second})
		}
		return err
	})
}

// observed runs one Azure call with a context that captures its HTTP
// response, and records it in the request metrics.
func (m *Manager) observed(ctx context.Context, request string, call func(ctx context.Context) error) error {
	var raw *http.Response
	start := time.Now()
	err := call(policy.WithCaptureResponse(ctx, &raw))
	m.m.call(m.cfg, request, start, raw, err)
	return err
}

func isNotFound(err error) bool {
	var rerr *azcore.ResponseError
	return errors.As(err, &rerr) && rerr.StatusCode == http.StatusNotFound
}

// apply sets the entries of the wanted nodes in pool; it reports whether
// anything changed.
func (m *Manager) apply(pool *armnetwork.BackendAddressPool, want map[*Node]State) bool {
	if pool.Properties == nil {
		return false
	}
	changed := false
	for _, entry := range pool.Properties.LoadBalancerBackendAddresses {
		if entry == nil || entry.Properties == nil {
			continue
		}
		for n, s := range want {
			if !n.owns(entry.Properties) {
				continue
			}
			m.mu.Lock()
			m.found[n.Name] = true
			m.mu.Unlock()
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
