package azurefake

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"k8s.io/utils/ptr"
)

// CloudControllerManager models what cloud-provider-azure's service
// controller does to the network at one reconcile, as far as a SKU
// migration meets it. With SKU basic it keeps a Basic load balancer for
// its Services, creating again one that is gone (so a migration that
// deletes Basic load balancers while it runs races it). With SKU standard
// it builds Standard load balancers: refused while a Basic one of the same
// name exists (Azure cannot change a SKU in place) and for a public IP
// still Basic; a frontend of the name it gives a Service is adopted as it
// is; an internal Service's private IP that something else holds is lost.
type CloudControllerManager struct {
	Network *Network
	// SKU is azure.json's loadBalancerSku: "basic" or "standard".
	SKU string
	// Cluster names the load balancers: Cluster and Cluster-internal.
	Cluster  string
	Services []CCMService
	// Errors are the last Reconcile's failures, one per Service or load
	// balancer.
	Errors []string
}

// CCMService is a LoadBalancer Service as cloud-provider-azure sees it.
type CCMService struct {
	Name string
	// FrontendName is the frontend IP configuration it gives the Service.
	FrontendName string
	// IP is the address the Service asks for (pinned).
	IP       string
	Internal bool
}

// Reconcile runs one reconcile of every Service.
func (c *CloudControllerManager) Reconcile() {
	n := c.Network
	n.mu.Lock()
	defer n.mu.Unlock()
	c.Errors = nil
	sku := armnetwork.LoadBalancerSKUNameStandard
	if strings.EqualFold(c.SKU, "basic") {
		sku = armnetwork.LoadBalancerSKUNameBasic
	}
	for _, internal := range []bool{false, true} {
		name := c.Cluster
		if internal {
			name += "-internal"
		}
		var services []CCMService
		for _, s := range c.Services {
			if s.Internal == internal {
				services = append(services, s)
			}
		}
		if len(services) > 0 {
			c.ensureLocked(name, sku, services)
		}
	}
}

// ensureLocked brings load balancer name to the Services' frontends.
func (c *CloudControllerManager) ensureLocked(name string, sku armnetwork.LoadBalancerSKUName, services []CCMService) {
	n := c.Network
	var lb armnetwork.LoadBalancer
	if data, ok := n.lbs[name]; ok {
		_ = json.Unmarshal(data, &lb)
		if lb.SKU != nil && lb.SKU.Name != nil && *lb.SKU.Name != sku {
			c.Errors = append(c.Errors, fmt.Sprintf("load balancer %s is %s, want %s: CannotChangeSkuOfExistingLoadBalancer", name, *lb.SKU.Name, sku))
			return
		}
	} else {
		lb = armnetwork.LoadBalancer{Name: ptr.To(name), SKU: &armnetwork.LoadBalancerSKU{Name: ptr.To(sku)}}
	}
	if lb.Properties == nil {
		lb.Properties = &armnetwork.LoadBalancerPropertiesFormat{}
	}
	for _, s := range services {
		if hasFrontend(&lb, s.FrontendName) {
			continue
		}
		fe, err := c.frontendLocked(name, sku, s)
		if err != nil {
			c.Errors = append(c.Errors, fmt.Sprintf("Service %s: %v", s.Name, err))
			continue
		}
		lb.Properties.FrontendIPConfigurations = append(lb.Properties.FrontendIPConfigurations, fe)
	}
	if len(lb.Properties.FrontendIPConfigurations) == 0 {
		return
	}
	n.lbs[name] = enc(lb)
	n.attachLocked(&lb, true)
}

// frontendLocked is the frontend cloud-provider-azure gives a Service on
// load balancer lb.
func (c *CloudControllerManager) frontendLocked(lb string, sku armnetwork.LoadBalancerSKUName, s CCMService) (*armnetwork.FrontendIPConfiguration, error) {
	n := c.Network
	if s.Internal {
		if holder := n.privateIPHolderLocked(s.IP, lb); holder != "" {
			return nil, fmt.Errorf("PrivateIPAddressInUse: %s is held by %s, and the Service loses its address", s.IP, holder)
		}
		return &armnetwork.FrontendIPConfiguration{Name: ptr.To(s.FrontendName), Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{
			PrivateIPAddress: ptr.To(s.IP), PrivateIPAllocationMethod: ptr.To(armnetwork.IPAllocationMethodStatic)}}, nil
	}
	for pipName, data := range n.pips {
		var p armnetwork.PublicIPAddress
		if json.Unmarshal(data, &p) != nil || p.Properties == nil || p.Properties.IPAddress == nil || *p.Properties.IPAddress != s.IP {
			continue
		}
		pipSKU := armnetwork.PublicIPAddressSKUNameBasic
		if p.SKU != nil && p.SKU.Name != nil {
			pipSKU = *p.SKU.Name
		}
		if string(pipSKU) != string(sku) {
			return nil, fmt.Errorf("public IP %s is %s, the load balancer %s: the SKUs must match", pipName, pipSKU, sku)
		}
		return &armnetwork.FrontendIPConfiguration{Name: ptr.To(s.FrontendName), ID: ptr.To(lb + "/" + s.FrontendName),
			Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{PublicIPAddress: &armnetwork.PublicIPAddress{ID: p.ID}}}, nil
	}
	return nil, fmt.Errorf("no public IP holds %s: the Service loses its address", s.IP)
}

func hasFrontend(lb *armnetwork.LoadBalancer, name string) bool {
	for _, fe := range lb.Properties.FrontendIPConfigurations {
		if fe != nil && fe.Name != nil && *fe.Name == name {
			return true
		}
	}
	return false
}
