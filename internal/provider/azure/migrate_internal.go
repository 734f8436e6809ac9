package azure

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

// An internal Service's address is a private IP of the subnet, held by its
// load balancer's frontend. Deleting the Basic load balancer frees it, and
// anything in the subnet may take it before cloud-provider-azure's next
// reconcile gives it back to the Service. The design has the frontend
// created with the Service's address as part of the migration
// (reconcileFrontendIPConfigs), so the migration does that itself: the
// deletion and the creation of a Standard load balancer of the same name
// holding the same frontends are one step, and cloud-provider-azure, whose
// names the frontends keep, completes that load balancer (pools, rules,
// probes) at its next reconcile.

// removeStep deletes a Basic load balancer, or, when it holds internal
// Services' addresses, replaces it with a Standard one that holds them.
func (m *Migrator) removeStep(lb *armnetwork.LoadBalancer, services []ServiceAddress) MigrationStep {
	name := *lb.Name
	keep := keptFrontends(lb, services)
	if len(keep) == 0 {
		return MigrationStep{Description: fmt.Sprintf("delete Basic load balancer %s", name), do: func(ctx context.Context) error {
			return m.deleteLB(ctx, name)
		}}
	}
	location := lb.Location
	return MigrationStep{Description: fmt.Sprintf("replace Basic load balancer %s with a Standard one holding its internal Services' addresses %s", name, frontendIPs(keep)),
		do: func(ctx context.Context) error {
			if err := m.deleteLB(ctx, name); err != nil {
				return err
			}
			return m.createInternal(ctx, name, location, keep)
		}}
}

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

// resumeInternal are the steps a run that stopped between a Basic internal
// load balancer's deletion and the creation of its Standard successor
// still owes: a Standard load balancer holding the addresses of the
// internal Services that no load balancer holds, with the frontend names
// cloud-provider-azure gives them (the Basic one's names are gone with it).
// When that load balancer exists already, it is cloud-provider-azure's,
// which gives the pinned Services their addresses itself.
func (m *Migrator) resumeInternal(lbs []*armnetwork.LoadBalancer, services []ServiceAddress) []MigrationStep {
	held := map[string]bool{}
	exists := map[string]bool{}
	for _, lb := range lbs {
		if lb.Name != nil {
			exists[strings.ToLower(*lb.Name)] = true
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
	name := m.cfg.LoadBalancerNames()[0] + internalSuffix
	if exists[strings.ToLower(name)] {
		return nil
	}
	var frontends []*armnetwork.FrontendIPConfiguration
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
	if len(frontends) == 0 {
		return nil
	}
	location := ptr(m.cfg.Location)
	return []MigrationStep{{Description: fmt.Sprintf("create Standard load balancer %s holding the internal Services' addresses %s, which no load balancer holds", name, frontendIPs(frontends)),
		do: func(ctx context.Context) error { return m.createInternal(ctx, name, location, frontends) }}}
}

// createInternal creates Standard load balancer name with frontends.
func (m *Migrator) createInternal(ctx context.Context, name string, location *string, frontends []*armnetwork.FrontendIPConfiguration) error {
	lb := armnetwork.LoadBalancer{Location: location, SKU: &armnetwork.LoadBalancerSKU{Name: ptr(armnetwork.LoadBalancerSKUNameStandard)},
		Properties: &armnetwork.LoadBalancerPropertiesFormat{FrontendIPConfigurations: frontends}}
	p, err := m.lbs.BeginCreateOrUpdate(ctx, m.cfg.LoadBalancerResourceGroup, name, lb, nil)
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
