package azurefake

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	azruntime "github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	computefake "github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9/fake"
	"k8s.io/utils/ptr"
)

// Network is an in-memory set of load balancers, public IPs, network
// interfaces and VM scale sets with Azure's rules that matter to a SKU
// migration: a load balancer's SKU cannot change in place (409); a load
// balancer whose backend pools a scale set's model or a network interface
// still references cannot be deleted (400, as cloud-provider-azure's safe
// delete expects); deleting a load balancer detaches its public IPs, and a
// Dynamic one loses its address; a public IP's SKU can change only while
// it is not attached (400), and a Standard one must be Static (400); a
// frontend's private IP that another load balancer's frontend or a network
// interface holds is refused (400 PrivateIPAddressInUse).
// FailOn makes the next call of an operation ("lb-put", "lb-delete",
// "pip-put", "vmss-put", "nic-put") fail, as a crash between steps would.
type Network struct {
	mu   sync.Mutex
	lbs  map[string][]byte
	pips map[string][]byte
	nics map[string][]byte
	vmss map[string][]byte
	// availabilitySets are the names of the availability sets.
	availabilitySets []string
	FailOn           map[string]int
	Calls            map[string]int
	// InstanceUpdates counts UpdateInstances calls per scale set.
	InstanceUpdates map[string]int
}

// NewNetwork returns an empty network.
func NewNetwork() *Network {
	return &Network{lbs: map[string][]byte{}, pips: map[string][]byte{}, nics: map[string][]byte{}, vmss: map[string][]byte{},
		FailOn: map[string]int{}, Calls: map[string]int{}, InstanceUpdates: map[string]int{}}
}

// AddInterface stores a network interface.
func (n *Network) AddInterface(nic armnetwork.Interface) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nics[*nic.Name] = enc(nic)
}

// Interface returns a stored network interface.
func (n *Network) Interface(name string) armnetwork.Interface {
	n.mu.Lock()
	defer n.mu.Unlock()
	nic, _ := decode[armnetwork.Interface](n.nics, name)
	return nic
}

// AddAvailabilitySet stores an availability set (its name is all the
// migration reads).
func (n *Network) AddAvailabilitySet(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.availabilitySets = append(n.availabilitySets, name)
}

// AddScaleSet stores a VM scale set.
func (n *Network) AddScaleSet(ss armcompute.VirtualMachineScaleSet) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.vmss[*ss.Name] = enc(ss)
}

// ScaleSet returns a stored VM scale set.
func (n *Network) ScaleSet(name string) armcompute.VirtualMachineScaleSet {
	n.mu.Lock()
	defer n.mu.Unlock()
	ss, _ := decode[armcompute.VirtualMachineScaleSet](n.vmss, name)
	return ss
}

// usersLocked names what still references load balancer lb's pools.
func (n *Network) usersLocked(lb string) []string {
	ref := "/loadbalancers/" + strings.ToLower(lb) + "/"
	var out []string
	for name, data := range n.vmss {
		if strings.Contains(strings.ToLower(string(data)), ref) {
			out = append(out, "virtual machine scale set "+name)
		}
	}
	for name, data := range n.nics {
		if strings.Contains(strings.ToLower(string(data)), ref) {
			out = append(out, "network interface "+name)
		}
	}
	return out
}

func enc(v any) []byte { b, _ := json.Marshal(v); return b }

// decode returns the stored JSON of name as a fresh T (ARM returns a copy
// per read), and whether it exists.
func decode[T any](store map[string][]byte, name string) (T, bool) {
	var v T
	data, ok := store[name]
	if ok {
		_ = json.Unmarshal(data, &v)
	}
	return v, ok
}

// decodeAll returns every stored object as a fresh T, in name order.
func decodeAll[T any](store map[string][]byte) []*T {
	names := make([]string, 0, len(store))
	for name := range store {
		names = append(names, name)
	}
	sort.Strings(names)
	out := make([]*T, 0, len(names))
	for _, name := range names {
		v, _ := decode[T](store, name)
		out = append(out, &v)
	}
	return out
}

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
	p, _ := decode[armnetwork.PublicIPAddress](n.pips, name)
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

// releaseDynamicLocked drops the address of lb's Dynamic public IPs: in
// Azure a Dynamic address is held only while the IP is in use.
func (n *Network) releaseDynamicLocked(lb *armnetwork.LoadBalancer) {
	if lb.Properties == nil {
		return
	}
	for _, fe := range lb.Properties.FrontendIPConfigurations {
		if fe.Properties == nil || fe.Properties.PublicIPAddress == nil || fe.Properties.PublicIPAddress.ID == nil {
			continue
		}
		name := (*fe.Properties.PublicIPAddress.ID)[strings.LastIndex(*fe.Properties.PublicIPAddress.ID, "/")+1:]
		var p armnetwork.PublicIPAddress
		if json.Unmarshal(n.pips[name], &p) != nil || p.Properties == nil || p.Properties.PublicIPAllocationMethod == nil ||
			*p.Properties.PublicIPAllocationMethod != armnetwork.IPAllocationMethodDynamic {
			continue
		}
		p.Properties.IPAddress = nil
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

// ClientOptions connect armnetwork and armcompute clients to this network.
func (n *Network) ClientOptions() *arm.ClientOptions {
	return &arm.ClientOptions{ClientOptions: policy.ClientOptions{
		Transport: routeTransport{
			lbs:     n,
			network: fake.NewServerFactoryTransport(&fake.ServerFactory{LoadBalancersServer: n.lbServer(), PublicIPAddressesServer: n.pipServer(), InterfacesServer: n.nicServer()}),
			compute: computefake.NewServerFactoryTransport(&computefake.ServerFactory{VirtualMachineScaleSetsServer: n.vmssServer(), AvailabilitySetsServer: n.availabilitySetServer()}),
		},
		Retry: policy.RetryOptions{MaxRetries: -1, RetryDelay: time.Millisecond},
	}}
}

// routeTransport sends compute clients' calls to the compute fake and the
// rest to the network fake (each fake serves only its own clients).
type routeTransport struct {
	network, compute policy.Transporter
	// lbs answers If-None-Match: * on a load balancer's PUT.
	lbs *Network
}

func (t routeTransport) Do(req *http.Request) (*http.Response, error) {
	if resp := t.lbs.refuseExisting(req); resp != nil {
		return resp, nil
	}
	if api, _ := req.Context().Value(azruntime.CtxAPINameKey{}).(string); strings.HasPrefix(api, "VirtualMachineScaleSets") || strings.HasPrefix(api, "AvailabilitySets") {
		return uncancelled(t.compute, req)
	}
	return uncancelled(t.network, req)
}

func (n *Network) nicServer() fake.InterfacesServer {
	return fake.InterfacesServer{
		Get: func(_ context.Context, _ string, name string, _ *armnetwork.InterfacesClientGetOptions) (resp azfake.Responder[armnetwork.InterfacesClientGetResponse], errResp azfake.ErrorResponder) {
			n.mu.Lock()
			defer n.mu.Unlock()
			nic, ok := decode[armnetwork.Interface](n.nics, name)
			if !ok {
				errResp.SetResponseError(http.StatusNotFound, "NotFound")
				return
			}
			resp.SetResponse(http.StatusOK, armnetwork.InterfacesClientGetResponse{Interface: nic}, nil)
			return
		},
		NewListPager: func(string, *armnetwork.InterfacesClientListOptions) (resp azfake.PagerResponder[armnetwork.InterfacesClientListResponse]) {
			n.mu.Lock()
			defer n.mu.Unlock()
			page := armnetwork.InterfacesClientListResponse{}
			page.Value = decodeAll[armnetwork.Interface](n.nics)
			resp.AddPage(http.StatusOK, page, nil)
			return
		},
		BeginCreateOrUpdate: func(_ context.Context, _ string, name string, nic armnetwork.Interface, _ *armnetwork.InterfacesClientBeginCreateOrUpdateOptions) (resp azfake.PollerResponder[armnetwork.InterfacesClientCreateOrUpdateResponse], errResp azfake.ErrorResponder) {
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.fail("nic-put") {
				errResp.SetResponseError(http.StatusInternalServerError, "InternalServerError")
				return
			}
			n.nics[name] = enc(nic)
			resp.SetTerminalResponse(http.StatusOK, armnetwork.InterfacesClientCreateOrUpdateResponse{Interface: nic}, nil)
			return
		},
	}
}

func (n *Network) vmssServer() computefake.VirtualMachineScaleSetsServer {
	return computefake.VirtualMachineScaleSetsServer{
		Get: func(_ context.Context, _ string, name string, _ *armcompute.VirtualMachineScaleSetsClientGetOptions) (resp azfake.Responder[armcompute.VirtualMachineScaleSetsClientGetResponse], errResp azfake.ErrorResponder) {
			n.mu.Lock()
			defer n.mu.Unlock()
			ss, ok := decode[armcompute.VirtualMachineScaleSet](n.vmss, name)
			if !ok {
				errResp.SetResponseError(http.StatusNotFound, "NotFound")
				return
			}
			resp.SetResponse(http.StatusOK, armcompute.VirtualMachineScaleSetsClientGetResponse{VirtualMachineScaleSet: ss}, nil)
			return
		},
		NewListPager: func(string, *armcompute.VirtualMachineScaleSetsClientListOptions) (resp azfake.PagerResponder[armcompute.VirtualMachineScaleSetsClientListResponse]) {
			n.mu.Lock()
			defer n.mu.Unlock()
			page := armcompute.VirtualMachineScaleSetsClientListResponse{}
			page.Value = decodeAll[armcompute.VirtualMachineScaleSet](n.vmss)
			resp.AddPage(http.StatusOK, page, nil)
			return
		},
		// A PUT with only the location and the network profile, as
		// cloud-provider-azure sends to detach pools, changes only the
		// network profile.
		BeginCreateOrUpdate: func(_ context.Context, _ string, name string, ss armcompute.VirtualMachineScaleSet, _ *armcompute.VirtualMachineScaleSetsClientBeginCreateOrUpdateOptions) (resp azfake.PollerResponder[armcompute.VirtualMachineScaleSetsClientCreateOrUpdateResponse], errResp azfake.ErrorResponder) {
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.fail("vmss-put") {
				errResp.SetResponseError(http.StatusInternalServerError, "InternalServerError")
				return
			}
			var cur armcompute.VirtualMachineScaleSet
			_ = json.Unmarshal(n.vmss[name], &cur)
			if cur.Properties == nil {
				cur.Properties = &armcompute.VirtualMachineScaleSetProperties{}
			}
			if cur.Properties.VirtualMachineProfile == nil {
				cur.Properties.VirtualMachineProfile = &armcompute.VirtualMachineScaleSetVMProfile{}
			}
			if ss.Properties != nil && ss.Properties.VirtualMachineProfile != nil {
				cur.Properties.VirtualMachineProfile.NetworkProfile = ss.Properties.VirtualMachineProfile.NetworkProfile
			}
			n.vmss[name] = enc(cur)
			resp.SetTerminalResponse(http.StatusOK, armcompute.VirtualMachineScaleSetsClientCreateOrUpdateResponse{VirtualMachineScaleSet: cur}, nil)
			return
		},
		BeginUpdateInstances: func(_ context.Context, _ string, name string, _ armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs, _ *armcompute.VirtualMachineScaleSetsClientBeginUpdateInstancesOptions) (resp azfake.PollerResponder[armcompute.VirtualMachineScaleSetsClientUpdateInstancesResponse], errResp azfake.ErrorResponder) {
			n.mu.Lock()
			defer n.mu.Unlock()
			n.InstanceUpdates[name]++
			resp.SetTerminalResponse(http.StatusOK, armcompute.VirtualMachineScaleSetsClientUpdateInstancesResponse{}, nil)
			return
		},
	}
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
		NewListPager: func(string, *armnetwork.LoadBalancersClientListOptions) (resp azfake.PagerResponder[armnetwork.LoadBalancersClientListResponse]) {
			n.mu.Lock()
			defer n.mu.Unlock()
			page := armnetwork.LoadBalancersClientListResponse{}
			page.Value = decodeAll[armnetwork.LoadBalancer](n.lbs)
			resp.AddPage(http.StatusOK, page, nil)
			return
		},
		BeginCreateOrUpdate: func(_ context.Context, _ string, name string, lb armnetwork.LoadBalancer, _ *armnetwork.LoadBalancersClientBeginCreateOrUpdateOptions) (resp azfake.PollerResponder[armnetwork.LoadBalancersClientCreateOrUpdateResponse], errResp azfake.ErrorResponder) {
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.fail("lb-put") {
				errResp.SetResponseError(http.StatusInternalServerError, "InternalServerError")
				return
			}
			if ip, holder := n.privateIPInUseLocked(name, &lb); holder != "" {
				errResp.SetResponseError(http.StatusBadRequest, "PrivateIPAddressInUse: "+ip+" is held by "+holder)
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
			if users := n.usersLocked(name); len(users) > 0 {
				errResp.SetResponseError(http.StatusBadRequest, "LoadBalancerInUseByVirtualMachineScaleSet")
				return
			}
			var cur armnetwork.LoadBalancer
			if data, ok := n.lbs[name]; ok {
				_ = json.Unmarshal(data, &cur)
				n.attachLocked(&cur, false)
				n.releaseDynamicLocked(&cur)
				delete(n.lbs, name)
			}
			resp.SetTerminalResponse(http.StatusOK, armnetwork.LoadBalancersClientDeleteResponse{}, nil)
			return
		},
	}
}

func (n *Network) pipServer() fake.PublicIPAddressesServer {
	return fake.PublicIPAddressesServer{
		Get: func(_ context.Context, _ string, name string, _ *armnetwork.PublicIPAddressesClientGetOptions) (resp azfake.Responder[armnetwork.PublicIPAddressesClientGetResponse], errResp azfake.ErrorResponder) {
			n.mu.Lock()
			defer n.mu.Unlock()
			p, ok := decode[armnetwork.PublicIPAddress](n.pips, name)
			if !ok {
				errResp.SetResponseError(http.StatusNotFound, "NotFound")
				return
			}
			resp.SetResponse(http.StatusOK, armnetwork.PublicIPAddressesClientGetResponse{PublicIPAddress: p}, nil)
			return
		},
		NewListPager: func(string, *armnetwork.PublicIPAddressesClientListOptions) (resp azfake.PagerResponder[armnetwork.PublicIPAddressesClientListResponse]) {
			n.mu.Lock()
			defer n.mu.Unlock()
			page := armnetwork.PublicIPAddressesClientListResponse{}
			page.Value = decodeAll[armnetwork.PublicIPAddress](n.pips)
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
			if p.SKU != nil && p.SKU.Name != nil && *p.SKU.Name == armnetwork.PublicIPAddressSKUNameStandard &&
				(p.Properties == nil || p.Properties.PublicIPAllocationMethod == nil || *p.Properties.PublicIPAllocationMethod != armnetwork.IPAllocationMethodStatic) {
				errResp.SetResponseError(http.StatusBadRequest, "StandardSkuPublicIPAddressesMustBeStatic")
				return
			}
			if cur.Properties != nil && p.Properties != nil {
				p.Properties.IPAddress = cur.Properties.IPAddress // the address is Azure's, not the caller's
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

func (n *Network) availabilitySetServer() computefake.AvailabilitySetsServer {
	return computefake.AvailabilitySetsServer{
		NewListPager: func(string, *armcompute.AvailabilitySetsClientListOptions) (resp azfake.PagerResponder[armcompute.AvailabilitySetsClientListResponse]) {
			n.mu.Lock()
			defer n.mu.Unlock()
			page := armcompute.AvailabilitySetsClientListResponse{}
			for _, name := range n.availabilitySets {
				page.Value = append(page.Value, &armcompute.AvailabilitySet{Name: ptr.To(name)})
			}
			resp.AddPage(http.StatusOK, page, nil)
			return
		},
	}
}

// refuseExisting answers a load balancer PUT with If-None-Match: * with 412
// when the load balancer exists, as ARM does (the SDK's fake server never
// sees the header); nil: the request goes on.
func (n *Network) refuseExisting(req *http.Request) *http.Response {
	if req.Method != http.MethodPut || req.Header.Get("If-None-Match") != "*" {
		return nil
	}
	_, rest, ok := strings.Cut(req.URL.Path, "/loadBalancers/")
	if !ok || strings.Contains(rest, "/") {
		return nil
	}
	if _, exists := n.LoadBalancer(rest); !exists {
		return nil
	}
	n.mu.Lock()
	n.Calls["lb-put-refused"]++
	n.mu.Unlock()
	body := `{"error":{"code":"PreconditionFailed","message":"load balancer ` + rest + ` exists"}}`
	return &http.Response{StatusCode: http.StatusPreconditionFailed, Status: "412 Precondition Failed", Request: req,
		Header: http.Header{"Content-Type": []string{"application/json"}}, Body: io.NopCloser(strings.NewReader(body))}
}
