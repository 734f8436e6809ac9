package azurefake

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9/fake"
)

// Network is an in-memory set of load balancers and public IPs with
// Azure's rules that matter to a SKU migration: a load balancer's SKU
// cannot change in place (409), a public IP's SKU can change only while it
// is not attached to a load balancer (400), and deleting a load balancer
// detaches its public IPs. FailOn makes the next call of an operation
// ("lb-put", "lb-delete", "pip-put") fail, as a crash between steps would.
type Network struct {
	mu     sync.Mutex
	lbs    map[string][]byte
	pips   map[string][]byte
	FailOn map[string]int
	Calls  map[string]int
}

// NewNetwork returns an empty network.
func NewNetwork() *Network {
	return &Network{lbs: map[string][]byte{}, pips: map[string][]byte{}, FailOn: map[string]int{}, Calls: map[string]int{}}
}

func enc(v any) []byte { b, _ := json.Marshal(v); return b }

// AddLoadBalancer stores a load balancer (its public IPs are attached).
func (n *Network) AddLoadBalancer(lb armnetwork.LoadBalancer) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lbs[*lb.Name] = enc(lb)
	n.attachLocked(&lb, true)
}

// AddPublicIP stores a public IP.
func (n *Network) AddPublicIP(p armnetwork.PublicIPAddress) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pips[*p.Name] = enc(p)
}

// LoadBalancer returns a stored load balancer and whether it exists.
func (n *Network) LoadBalancer(name string) (armnetwork.LoadBalancer, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var lb armnetwork.LoadBalancer
	data, ok := n.lbs[name]
	_ = json.Unmarshal(data, &lb)
	return lb, ok
}

// PublicIP returns a stored public IP.
func (n *Network) PublicIP(name string) armnetwork.PublicIPAddress {
	n.mu.Lock()
	defer n.mu.Unlock()
	var p armnetwork.PublicIPAddress
	_ = json.Unmarshal(n.pips[name], &p)
	return p
}

// attachLocked marks the public IPs lb's frontends use as attached (or not).
func (n *Network) attachLocked(lb *armnetwork.LoadBalancer, on bool) {
	if lb.Properties == nil {
		return
	}
	for _, fe := range lb.Properties.FrontendIPConfigurations {
		if fe.Properties == nil || fe.Properties.PublicIPAddress == nil || fe.Properties.PublicIPAddress.ID == nil {
			continue
		}
		name := (*fe.Properties.PublicIPAddress.ID)[strings.LastIndex(*fe.Properties.PublicIPAddress.ID, "/")+1:]
		var p armnetwork.PublicIPAddress
		if json.Unmarshal(n.pips[name], &p) != nil || p.Properties == nil {
			continue
		}
		p.Properties.IPConfiguration = nil
		if on {
			p.Properties.IPConfiguration = &armnetwork.IPConfiguration{ID: fe.ID}
		}
		n.pips[name] = enc(p)
	}
}

func (n *Network) fail(op string) bool {
	n.Calls[op]++
	if n.FailOn[op] > 0 {
		n.FailOn[op]--
		return true
	}
	return false
}

// ClientOptions connect armnetwork clients to this network.
func (n *Network) ClientOptions() *arm.ClientOptions {
	return &arm.ClientOptions{ClientOptions: policy.ClientOptions{
		Transport: fake.NewServerFactoryTransport(&fake.ServerFactory{LoadBalancersServer: n.lbServer(), PublicIPAddressesServer: n.pipServer()}),
		Retry:     policy.RetryOptions{MaxRetries: -1, RetryDelay: time.Millisecond},
	}}
}

func (n *Network) lbServer() fake.LoadBalancersServer {
	return fake.LoadBalancersServer{
		Get: func(_ context.Context, _ string, name string, _ *armnetwork.LoadBalancersClientGetOptions) (resp azfake.Responder[armnetwork.LoadBalancersClientGetResponse], errResp azfake.ErrorResponder) {
			lb, ok := n.LoadBalancer(name)
			if !ok {
				errResp.SetResponseError(http.StatusNotFound, "ResourceNotFound")
				return
			}
			resp.SetResponse(http.StatusOK, armnetwork.LoadBalancersClientGetResponse{LoadBalancer: lb}, nil)
			return
		},
		BeginCreateOrUpdate: func(_ context.Context, _ string, name string, lb armnetwork.LoadBalancer, _ *armnetwork.LoadBalancersClientBeginCreateOrUpdateOptions) (resp azfake.PollerResponder[armnetwork.LoadBalancersClientCreateOrUpdateResponse], errResp azfake.ErrorResponder) {
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.fail("lb-put") {
				errResp.SetResponseError(http.StatusInternalServerError, "InternalServerError")
				return
			}
			var cur armnetwork.LoadBalancer
			if data, ok := n.lbs[name]; ok {
				_ = json.Unmarshal(data, &cur)
				if cur.SKU != nil && lb.SKU != nil && *cur.SKU.Name != *lb.SKU.Name {
					errResp.SetResponseError(http.StatusConflict, "CannotChangeSkuOfExistingLoadBalancer")
					return
				}
				n.attachLocked(&cur, false)
			}
			lb.Name = &name
			n.lbs[name] = enc(lb)
			n.attachLocked(&lb, true)
			resp.SetTerminalResponse(http.StatusOK, armnetwork.LoadBalancersClientCreateOrUpdateResponse{LoadBalancer: lb}, nil)
			return
		},
		BeginDelete: func(_ context.Context, _ string, name string, _ *armnetwork.LoadBalancersClientBeginDeleteOptions) (resp azfake.PollerResponder[armnetwork.LoadBalancersClientDeleteResponse], errResp azfake.ErrorResponder) {
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.fail("lb-delete") {
				errResp.SetResponseError(http.StatusInternalServerError, "InternalServerError")
				return
			}
			var cur armnetwork.LoadBalancer
			if data, ok := n.lbs[name]; ok {
				_ = json.Unmarshal(data, &cur)
				n.attachLocked(&cur, false)
				delete(n.lbs, name)
			}
			resp.SetTerminalResponse(http.StatusOK, armnetwork.LoadBalancersClientDeleteResponse{}, nil)
			return
		},
	}
}

func (n *Network) pipServer() fake.PublicIPAddressesServer {
	return fake.PublicIPAddressesServer{
		NewListPager: func(string, *armnetwork.PublicIPAddressesClientListOptions) (resp azfake.PagerResponder[armnetwork.PublicIPAddressesClientListResponse]) {
			n.mu.Lock()
			defer n.mu.Unlock()
			page := armnetwork.PublicIPAddressesClientListResponse{}
			for _, data := range n.pips {
				var p armnetwork.PublicIPAddress
				_ = json.Unmarshal(data, &p)
				page.Value = append(page.Value, &p)
			}
			resp.AddPage(http.StatusOK, page, nil)
			return
		},
		BeginCreateOrUpdate: func(_ context.Context, _ string, name string, p armnetwork.PublicIPAddress, _ *armnetwork.PublicIPAddressesClientBeginCreateOrUpdateOptions) (resp azfake.PollerResponder[armnetwork.PublicIPAddressesClientCreateOrUpdateResponse], errResp azfake.ErrorResponder) {
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.fail("pip-put") {
				errResp.SetResponseError(http.StatusInternalServerError, "InternalServerError")
				return
			}
			var cur armnetwork.PublicIPAddress
			_ = json.Unmarshal(n.pips[name], &cur)
			if cur.Properties != nil && cur.Properties.IPConfiguration != nil && cur.SKU != nil && p.SKU != nil && *cur.SKU.Name != *p.SKU.Name {
				errResp.SetResponseError(http.StatusBadRequest, "PublicIPAddressInUse")
				return
			}
			if p.Properties != nil && cur.Properties != nil {
				p.Properties.IPConfiguration = cur.Properties.IPConfiguration
			}
			n.pips[name] = enc(p)
			resp.SetTerminalResponse(http.StatusOK, armnetwork.PublicIPAddressesClientCreateOrUpdateResponse{PublicIPAddress: p}, nil)
			return
		},
	}
}
