package azurefake

import (
	"encoding/json"
	"slices"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"k8s.io/utils/ptr"
)

// A private IP of the subnet belongs to one holder at a time: a load
// balancer's frontend or a network interface. Azure frees it when its
// holder goes, and anything in the subnet may take it then.

// privateIPHolderLocked names what holds ip, other than load balancer
// except ("" if nothing does).
func (n *Network) privateIPHolderLocked(ip, except string) string {
	for name, data := range n.lbs {
		if name == except {
			continue
		}
		var lb armnetwork.LoadBalancer
		if json.Unmarshal(data, &lb) == nil && slices.ContainsFunc(frontendPrivateIPs(&lb), func(x string) bool { return strings.EqualFold(x, ip) }) {
			return "load balancer " + name
		}
	}
	for name, data := range n.nics {
		var nic armnetwork.Interface
		if json.Unmarshal(data, &nic) != nil || nic.Properties == nil {
			continue
		}
		for _, c := range nic.Properties.IPConfigurations {
			if c != nil && c.Properties != nil && c.Properties.PrivateIPAddress != nil && *c.Properties.PrivateIPAddress == ip {
				return "network interface " + name
			}
		}
	}
	return ""
}

// privateIPInUseLocked returns a private IP of lb's frontends that
// something else holds, and what.
func (n *Network) privateIPInUseLocked(name string, lb *armnetwork.LoadBalancer) (string, string) {
	for _, ip := range frontendPrivateIPs(lb) {
		if holder := n.privateIPHolderLocked(ip, name); holder != "" {
			return ip, holder
		}
	}
	return "", ""
}

func frontendPrivateIPs(lb *armnetwork.LoadBalancer) []string {
	if lb.Properties == nil {
		return nil
	}
	var out []string
	for _, fe := range lb.Properties.FrontendIPConfigurations {
		if fe != nil && fe.Properties != nil && fe.Properties.PrivateIPAddress != nil {
			out = append(out, *fe.Properties.PrivateIPAddress)
		}
	}
	return out
}

// ClaimPrivateIP gives ip to a new network interface, as another
// deployment in the subnet would, if nothing holds it; it reports whether
// it did.
func (n *Network) ClaimPrivateIP(nicName, ip string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.privateIPHolderLocked(ip, "") != "" {
		return false
	}
	n.nics[nicName] = enc(armnetwork.Interface{Name: &nicName, Properties: &armnetwork.InterfacePropertiesFormat{IPConfigurations: []*armnetwork.InterfaceIPConfiguration{{
		Name: ptr.To("ipconfig1"), Properties: &armnetwork.InterfaceIPConfigurationPropertiesFormat{PrivateIPAddress: &ip}}}}})
	return true
}
