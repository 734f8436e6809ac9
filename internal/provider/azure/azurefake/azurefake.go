// Package azurefake is an in-memory Azure Load Balancer backend-pool API
// behind the SDK's own fake server (armnetwork/v9/fake): pools are stored
// as ARM would (a fresh copy per read), etags change on every write, and,
// as in ARM, the etag in a body is ignored: only an If-Match header that
// names a stale etag makes a write fail (412); a write without one wins
// over whatever another writer did. Listing a load balancer that does not
// exist is a 404. Another writer, conflicts, throttling and failures can
// be injected; calls are counted.
package azurefake

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	azruntime "github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	computefake "github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9/fake"
)

// Cloud holds load balancers' backend pools.
type Cloud struct {
	mu    sync.Mutex
	pools map[string]map[string][]byte // load balancer -> pool -> JSON
	order map[string][]string
	vms   map[string][]byte // virtual machine name -> JSON
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
	// OtherWriterNext, when set, runs once just before the next write is
	// applied, as another writer (cloud-provider-azure) changing the
	// stored pool between ebb's read and ebb's write; the etag changes.
	OtherWriterNext func(lb, pool string, p *armnetwork.BackendAddressPool)
}

// New returns an empty cloud.
func New() *Cloud {
	return &Cloud{pools: map[string]map[string][]byte{}, order: map[string][]string{}, vms: map[string][]byte{}, Calls: map[string]int{}}
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

// Rewrite changes a stored pool as another writer would (for example
// cloud-provider-azure's EnsureHostsInPool from its cache): f edits it and
// the etag changes.
func (c *Cloud) Rewrite(lb, name string, f func(*armnetwork.BackendAddressPool)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rewrite(lb, name, f)
}

func (c *Cloud) rewrite(lb, name string, f func(*armnetwork.BackendAddressPool)) {
	var p armnetwork.BackendAddressPool
	_ = json.Unmarshal(c.pools[lb][name], &p)
	f(&p)
	c.etag++
	p.Etag = new(string)
	*p.Etag = fmt.Sprintf("W/\"%d\"", c.etag)
	data, _ := json.Marshal(p)
	c.pools[lb][name] = data
}

// AddVM stores a virtual machine (an availability-set or VMSS Flex VM, a
// resource of its own) with its network interfaces.
func (c *Cloud) AddVM(name string, nicIDs ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	vm := armcompute.VirtualMachine{Name: &name, Properties: &armcompute.VirtualMachineProperties{NetworkProfile: &armcompute.NetworkProfile{}}}
	for _, id := range nicIDs {
		vm.Properties.NetworkProfile.NetworkInterfaces = append(vm.Properties.NetworkProfile.NetworkInterfaces, &armcompute.NetworkInterfaceReference{ID: &id})
	}
	c.vms[name] = enc(vm)
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
		Transport: c.transport(),
		Retry:     policy.RetryOptions{MaxRetries: 3, RetryDelay: time.Millisecond, MaxRetryDelay: 5 * time.Millisecond},
	}}
}

// Credential is a token credential that needs no Azure.
type Credential struct{}

// GetToken returns a fake token.
func (Credential) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: "fake", ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// ifMatchKey carries a request's If-Match header to the fake server's
// functions, which see only the request's context.
type ifMatchKey struct{}

// transport answers what the SDK's fake server cannot and passes the
// headers the fake must enforce on.
type transport struct {
	c         *Cloud
	next, vms policy.Transporter
}

func (c *Cloud) transport() transport {
	return transport{c: c, next: fake.NewLoadBalancerBackendAddressPoolsServerTransport(c.Server()),
		vms: computefake.NewVirtualMachinesServerTransport(c.vmServer())}
}

func (c *Cloud) vmServer() *computefake.VirtualMachinesServer {
	return &computefake.VirtualMachinesServer{
		Get: func(_ context.Context, _ string, name string, _ *armcompute.VirtualMachinesClientGetOptions) (resp azfake.Responder[armcompute.VirtualMachinesClientGetResponse], errResp azfake.ErrorResponder) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.Calls["vm-get"]++
			vm, ok := decode[armcompute.VirtualMachine](c.vms, name)
			if !ok {
				errResp.SetResponseError(http.StatusNotFound, "ResourceNotFound")
				return
			}
			resp.SetResponse(http.StatusOK, armcompute.VirtualMachinesClientGetResponse{VirtualMachine: vm}, nil)
			return
		},
	}
}

func (t transport) Do(req *http.Request) (*http.Response, error) {
	if api, _ := req.Context().Value(azruntime.CtxAPINameKey{}).(string); strings.HasPrefix(api, "VirtualMachinesClient.") {
		return uncancelled(t.vms, req)
	}
	// Listing the pools of a load balancer that does not exist is a 404,
	// answered here: the fake server keeps a pager whose first page is an
	// error, and answers the next list of the same load balancer "empty".
	if parts := strings.Split(strings.TrimSuffix(req.URL.Path, "/"), "/"); req.Method == http.MethodGet && len(parts) > 2 && parts[len(parts)-1] == "backendAddressPools" {
		lb := parts[len(parts)-2]
		t.c.mu.Lock()
		_, ok := t.c.pools[lb]
		if !ok {
			t.c.Calls["list"]++
		}
		t.c.mu.Unlock()
		if !ok {
			body := fmt.Sprintf(`{"error":{"code":"ResourceNotFound","message":"The Resource 'Microsoft.Network/loadBalancers/%s' was not found."}}`, lb)
			return &http.Response{StatusCode: http.StatusNotFound, Status: "404 Not Found", Request: req, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Header: http.Header{"Content-Type": []string{"application/json"}, "X-Ms-Error-Code": []string{"ResourceNotFound"}}, Body: io.NopCloser(strings.NewReader(body))}, nil
		}
	}
	if v := req.Header.Get("If-Match"); v != "" {
		req = req.WithContext(context.WithValue(req.Context(), ifMatchKey{}, v))
	}
	return uncancelled(t.next, req)
}

// uncancelled passes req to one of the SDK's fake transports with a
// context that is never cancelled. Those transports race a cancelled
// request: they return at once and close the channel that their worker
// may still send the answer on, which panics the process (seen in CI
// when a test's context ended with a request in flight). The fake servers
// answer from memory without waiting, so not cancelling them costs
// nothing.
func uncancelled(next policy.Transporter, req *http.Request) (*http.Response, error) {
	return next.Do(req.WithContext(context.WithoutCancel(req.Context())))
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
			p, ok := decode[armnetwork.BackendAddressPool](c.pools[lb], name)
			if !ok {
				errResp.SetResponseError(http.StatusNotFound, "NotFound")
				return
			}
			resp.SetResponse(http.StatusOK, armnetwork.LoadBalancerBackendAddressPoolsClientGetResponse{BackendAddressPool: p}, nil)
			return
		},
		BeginCreateOrUpdate: func(ctx context.Context, _ string, lb, name string, pool armnetwork.BackendAddressPool, _ *armnetwork.LoadBalancerBackendAddressPoolsClientBeginCreateOrUpdateOptions) (resp azfake.PollerResponder[armnetwork.LoadBalancerBackendAddressPoolsClientCreateOrUpdateResponse], errResp azfake.ErrorResponder) {
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
			if c.ConflictNext > 0 {
				c.ConflictNext--
				c.rewrite(lb, name, func(*armnetwork.BackendAddressPool) {})
			}
			if f := c.OtherWriterNext; f != nil {
				c.OtherWriterNext = nil
				c.rewrite(lb, name, func(p *armnetwork.BackendAddressPool) { f(lb, name, p) })
			}
			var cur armnetwork.BackendAddressPool
			_ = json.Unmarshal(c.pools[lb][name], &cur)
			if ifMatch, _ := ctx.Value(ifMatchKey{}).(string); ifMatch != "" && (cur.Etag == nil || ifMatch != *cur.Etag) {
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
