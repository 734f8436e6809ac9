// Package azurefake is an in-memory Azure Load Balancer backend-pool API
// behind the SDK's own fake server (armnetwork/v9/fake): pools are stored
// as ARM would (a fresh copy per read), etags change on every write and a
// write with a stale etag is refused (412); conflicts, throttling and
// failures can be injected; calls are counted.
package azurefake

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9/fake"
)

// Cloud holds load balancers' backend pools.
type Cloud struct {
	mu    sync.Mutex
	pools map[string]map[string][]byte // load balancer -> pool -> JSON
	order map[string][]string
	etag  int
	// Calls counts operations: "list", "get", "put".
	Calls map[string]int
	// ConflictNext makes the next writes meet a concurrent writer (their
	// etag is stale): 412.
	ConflictNext int
	// ThrottleNext answers the next writes 429 (ARM's write limits).
	ThrottleNext int
	// FailNext answers the next writes 400.
	FailNext int
}

// New returns an empty cloud.
func New() *Cloud {
	return &Cloud{pools: map[string]map[string][]byte{}, order: map[string][]string{}, Calls: map[string]int{}}
}

// AddPool stores a pool on a load balancer.
func (c *Cloud) AddPool(lb string, pool armnetwork.BackendAddressPool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pools[lb] == nil {
		c.pools[lb] = map[string][]byte{}
	}
	c.etag++
	pool.Etag = new(string)
	*pool.Etag = "W/\"" + strconv.Itoa(c.etag) + "\""
	data, _ := json.Marshal(pool)
	if _, ok := c.pools[lb][*pool.Name]; !ok {
		c.order[lb] = append(c.order[lb], *pool.Name)
	}
	c.pools[lb][*pool.Name] = data
}

// Pool returns a copy of a stored pool.
func (c *Cloud) Pool(lb, name string) armnetwork.BackendAddressPool {
	c.mu.Lock()
	defer c.mu.Unlock()
	var p armnetwork.BackendAddressPool
	_ = json.Unmarshal(c.pools[lb][name], &p)
	return p
}

// Count returns how many calls of a kind were made.
func (c *Cloud) Count(kind string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Calls[kind]
}

// ClientOptions connect an armnetwork client to this cloud, with fast
// retries.
func (c *Cloud) ClientOptions() *arm.ClientOptions {
	return &arm.ClientOptions{ClientOptions: policy.ClientOptions{
		Transport: fake.NewLoadBalancerBackendAddressPoolsServerTransport(c.Server()),
		Retry:     policy.RetryOptions{MaxRetries: 3, RetryDelay: time.Millisecond, MaxRetryDelay: 5 * time.Millisecond},
	}}
}

// Credential is a token credential that needs no Azure.
type Credential struct{}

// GetToken returns a fake token.
func (Credential) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: "fake", ExpiresOn: time.Now().Add(time.Hour)}, nil
}

func (c *Cloud) throttled() bool {
	if c.ThrottleNext > 0 {
		c.ThrottleNext--
		return true
	}
	return false
}

// Server is the fake server over this cloud.
func (c *Cloud) Server() *fake.LoadBalancerBackendAddressPoolsServer {
	return &fake.LoadBalancerBackendAddressPoolsServer{
		NewListPager: func(_ string, lb string, _ *armnetwork.LoadBalancerBackendAddressPoolsClientListOptions) (resp azfake.PagerResponder[armnetwork.LoadBalancerBackendAddressPoolsClientListResponse]) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.Calls["list"]++
			page := armnetwork.LoadBalancerBackendAddressPoolsClientListResponse{}
			for _, name := range c.order[lb] {
				var p armnetwork.BackendAddressPool
				_ = json.Unmarshal(c.pools[lb][name], &p)
				page.Value = append(page.Value, &p)
			}
			resp.AddPage(http.StatusOK, page, nil)
			return resp
		},
		Get: func(_ context.Context, _ string, lb, name string, _ *armnetwork.LoadBalancerBackendAddressPoolsClientGetOptions) (resp azfake.Responder[armnetwork.LoadBalancerBackendAddressPoolsClientGetResponse], errResp azfake.ErrorResponder) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.Calls["get"]++
			data, ok := c.pools[lb][name]
			if !ok {
				errResp.SetResponseError(http.StatusNotFound, "NotFound")
				return
			}
			var p armnetwork.BackendAddressPool
			_ = json.Unmarshal(data, &p)
			resp.SetResponse(http.StatusOK, armnetwork.LoadBalancerBackendAddressPoolsClientGetResponse{BackendAddressPool: p}, nil)
			return
		},
		BeginCreateOrUpdate: func(_ context.Context, _ string, lb, name string, pool armnetwork.BackendAddressPool, _ *armnetwork.LoadBalancerBackendAddressPoolsClientBeginCreateOrUpdateOptions) (resp azfake.PollerResponder[armnetwork.LoadBalancerBackendAddressPoolsClientCreateOrUpdateResponse], errResp azfake.ErrorResponder) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.Calls["put"]++
			switch {
			case c.throttled():
				errResp.SetResponseError(http.StatusTooManyRequests, "TooManyRequests")
				return
			case c.FailNext > 0:
				c.FailNext--
				errResp.SetResponseError(http.StatusBadRequest, "InvalidRequest")
				return
			}
			var cur armnetwork.BackendAddressPool
			_ = json.Unmarshal(c.pools[lb][name], &cur)
			if c.ConflictNext > 0 {
				c.ConflictNext--
				c.etag++
				cur.Etag = new(string)
				*cur.Etag = fmt.Sprintf("W/\"%d\"", c.etag)
				data, _ := json.Marshal(cur)
				c.pools[lb][name] = data
			}
			if pool.Etag == nil || cur.Etag == nil || *pool.Etag != *cur.Etag {
				errResp.SetResponseError(http.StatusPreconditionFailed, "PreconditionFailed")
				return
			}
			c.etag++
			pool.Etag = new(string)
			*pool.Etag = fmt.Sprintf("W/\"%d\"", c.etag)
			data, _ := json.Marshal(pool)
			c.pools[lb][name] = data
			resp.SetTerminalResponse(http.StatusOK, armnetwork.LoadBalancerBackendAddressPoolsClientCreateOrUpdateResponse{BackendAddressPool: pool}, nil)
			return
		},
	}
}
