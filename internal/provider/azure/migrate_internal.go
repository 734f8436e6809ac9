package azure

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	azpolicy "github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

// An internal Service's address is a private IP of the subnet, held by its
// load balancer's frontend. Deleting the Basic load balancer frees it, and
// anything in the subnet may take it before cloud-provider-azure's next
// reconcile gives it back to the Service. The design has the frontend
// created with the Service's address as part of the migration
// (reconcileFrontendIPConfigs), so the migration does that itself: the
// deletion of the Basic load balancers that hold internal addresses and
// the creation of the Standard <cluster>-internal holding the same
// frontends are one step, and cloud-provider-azure, whose names the
// frontends keep, completes that load balancer (pools, rules, probes) at
// its next reconcile.

// keptFrontends are copies of lb's frontends that hold an internal
// Service's address, with only what a Standard load balancer's frontend
// takes: the name cloud-provider-azure gave it, the address, now Static,
// and the subnet.
func keptFrontends(lb *armnetwork.LoadBalancer, services []ServiceAddress) []*armnetwork.FrontendIPConfiguration {
	if lb.Properties == nil {
		return nil
	}
	var out []*armnetwork.FrontendIPConfiguration
	for _, fe := range lb.Properties.FrontendIPConfigurations {
		if fe == nil || fe.Name == nil || fe.Properties == nil || fe.Properties.PrivateIPAddress == nil || !isInternalAddress(services, *fe.Properties.PrivateIPAddress) {
			continue
		}
		props := &armnetwork.FrontendIPConfigurationPropertiesFormat{PrivateIPAddress: fe.Properties.PrivateIPAddress,
			PrivateIPAllocationMethod: ptr(armnetwork.IPAllocationMethodStatic), PrivateIPAddressVersion: fe.Properties.PrivateIPAddressVersion}
		if fe.Properties.Subnet != nil {
			props.Subnet = &armnetwork.Subnet{ID: fe.Properties.Subnet.ID}
		}
		out = append(out, &armnetwork.FrontendIPConfiguration{Name: fe.Name, Properties: props})
	}
	return out
}

func isInternalAddress(services []ServiceAddress, ip string) bool {
	for _, s := range services {
		if s.Internal && strings.EqualFold(s.IP, ip) {
			return true
		}
	}
	return false
}

// internalSteps replace the Basic load balancers that hold internal
// Services' addresses (internals) with the Standard load balancer
// cloud-provider-azure builds for internal Services, <cluster>-internal,
// holding their frontends, in one step: the Basic ones are deleted, and the
// Standard one is created at once with their frontends (names, private
// IPs, subnets). The same step gives it the addresses of internal Services
// that no load balancer holds: a run that stopped between the deletion and
// the creation left them free, and their Basic frontends' names are gone,
// so they get the names cloud-provider-azure gives (FrontendName). When
// <cluster>-internal exists already as a Standard load balancer, it is
// cloud-provider-azure's: the Basic ones are deleted, and it gives the
// pinned Services their addresses at its next reconcile.
func (m *Migrator) internalSteps(lbs, internals []*armnetwork.LoadBalancer, services []ServiceAddress) []MigrationStep {
	target := m.cfg.LoadBalancerNames()[0] + internalSuffix
	held := map[string]bool{}
	targetIsStandard := false
	for _, lb := range lbs {
		if lb.Name != nil && strings.EqualFold(*lb.Name, target) && !isBasic(lb.SKU) {
			targetIsStandard = true
		}
		if lb.Properties == nil {
			continue
		}
		for _, fe := range lb.Properties.FrontendIPConfigurations {
			if fe != nil && fe.Properties != nil && fe.Properties.PrivateIPAddress != nil {
				held[strings.ToLower(*fe.Properties.PrivateIPAddress)] = true
			}
		}
	}
	var names []string
	var frontends []*armnetwork.FrontendIPConfiguration
	for _, lb := range internals {
		names = append(names, *lb.Name)
		frontends = append(frontends, keptFrontends(lb, services)...)
	}
	for _, s := range services {
		if !s.Internal || held[strings.ToLower(s.IP)] {
			continue
		}
		props := &armnetwork.FrontendIPConfigurationPropertiesFormat{PrivateIPAddress: ptr(s.IP), PrivateIPAllocationMethod: ptr(armnetwork.IPAllocationMethodStatic)}
		if id := m.subnetID(s.Subnet); id != "" {
			props.Subnet = &armnetwork.Subnet{ID: ptr(id)}
		}
		frontends = append(frontends, &armnetwork.FrontendIPConfiguration{Name: ptr(s.FrontendName()), Properties: props})
	}
	location := ptr(m.cfg.Location)
	for _, lb := range internals {
		if lb.Location != nil {
			location = lb.Location
		}
	}
	deleteAll := func(ctx context.Context) error {
		for _, name := range names {
			if err := m.deleteLB(ctx, name); err != nil {
				return err
			}
		}
		return nil
	}
	switch {
	case targetIsStandard && len(names) > 0:
		return []MigrationStep{{Description: fmt.Sprintf("delete Basic load balancer(s) %s (cloud-provider-azure's Standard %s exists and takes their internal Services' addresses %s)", strings.Join(names, ", "), target, frontendIPs(frontends)),
			do: deleteAll}}
	case targetIsStandard || len(frontends) == 0:
		return nil
	case len(names) == 0:
		return []MigrationStep{{Description: fmt.Sprintf("create Standard load balancer %s holding the internal Services' addresses %s, which no load balancer holds", target, frontendIPs(frontends)),
			do: func(ctx context.Context) error { return m.createInternal(ctx, target, location, frontends) }}}
	}
	return []MigrationStep{{Description: fmt.Sprintf("replace Basic load balancer(s) %s with Standard load balancer %s holding their internal Services' addresses %s", strings.Join(names, ", "), target, frontendIPs(frontends)),
		do: func(ctx context.Context) error {
			if err := deleteAll(ctx); err != nil {
				return err
			}
			return m.createInternal(ctx, target, location, frontends)
		}}}
}

// createInternal creates Standard load balancer name with frontends, and
// only creates it: If-None-Match: * makes Azure refuse the PUT if
// cloud-provider-azure built the load balancer meanwhile, whose pools,
// rules and probes a blind PUT would replace.
func (m *Migrator) createInternal(ctx context.Context, name string, location *string, frontends []*armnetwork.FrontendIPConfiguration) error {
	lb := armnetwork.LoadBalancer{Location: location, SKU: &armnetwork.LoadBalancerSKU{Name: ptr(armnetwork.LoadBalancerSKUNameStandard)},
		Properties: &armnetwork.LoadBalancerPropertiesFormat{FrontendIPConfigurations: frontends}}
	createOnly := azpolicy.WithHTTPHeader(ctx, http.Header{"If-None-Match": []string{"*"}})
	p, err := m.lbs.BeginCreateOrUpdate(createOnly, m.cfg.LoadBalancerResourceGroup, name, lb, nil)
	if err == nil {
		_, err = p.PollUntilDone(ctx, pollOpts)
	}
	if err != nil {
		return fmt.Errorf("creating Standard load balancer %s to hold the internal Services' addresses %s: %w", name, frontendIPs(frontends), err)
	}
	return nil
}

// subnetID is the ID of an internal frontend's subnet: the Service's, or
// azure.json's (empty when azure.json names none).
func (m *Migrator) subnetID(subnet string) string {
	if subnet == "" {
		subnet = m.cfg.SubnetName
	}
	if subnet == "" || m.cfg.VnetName == "" {
		return ""
	}
	group := m.cfg.VnetResourceGroup
	if group == "" {
		group = m.cfg.ResourceGroup
	}
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/virtualNetworks/%s/subnets/%s", m.cfg.SubscriptionID, group, m.cfg.VnetName, subnet)
}

// frontendNameMaxLength is Azure's limit on a frontend IP configuration's
// name, less the IP family suffix cloud-provider-azure may add.
const frontendNameMaxLength = 80 - len(ipv6Suffix)

const ipv6Suffix = "-IPv6"

// FrontendName is the name cloud-provider-azure gives the Service's
// frontend IP configuration: "a" and the Service's UID without dashes, cut
// to 32 characters; then "-" and the subnet, for an internal Service that
// names one; then "-IPv6" for the IPv6 address of a dual-stack Service.
func (s ServiceAddress) FrontendName() string {
	name := strings.ReplaceAll("a"+s.UID, "-", "")
	if len(name) > 32 {
		name = name[:32]
	}
	if s.Internal && s.Subnet != "" {
		name += "-" + s.Subnet
		if len(name) > frontendNameMaxLength {
			name = name[:frontendNameMaxLength]
		}
	}
	if addr, err := netip.ParseAddr(s.IP); err == nil && addr.Unmap().Is6() && s.DualStack {
		name += ipv6Suffix
	}
	return name
}

func frontendIPs(frontends []*armnetwork.FrontendIPConfiguration) string {
	var ips []string
	for _, fe := range frontends {
		ips = append(ips, *fe.Properties.PrivateIPAddress)
	}
	return strings.Join(ips, ", ")
}
