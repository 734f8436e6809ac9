package azure

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

// lbUsers are what may reference a load balancer's pools: the resource
// group's VM scale sets and network interfaces.
type lbUsers struct {
	scaleSets []*armcompute.VirtualMachineScaleSet
	nics      []*armnetwork.Interface
	// vmSets name the scale sets and availability sets, after which
	// cloud-provider-azure names a Basic cluster's load balancers.
	vmSets []string
}

func (m *Migrator) lbUsers(ctx context.Context) (*lbUsers, error) {
	out := &lbUsers{}
	scaleSets := m.scaleSets.NewListPager(m.cfg.ResourceGroup, nil)
	for scaleSets.More() {
		page, err := scaleSets.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("listing VM scale sets: %w", err)
		}
		out.scaleSets = append(out.scaleSets, page.Value...)
		for _, ss := range page.Value {
			if ss.Name != nil {
				out.vmSets = append(out.vmSets, *ss.Name)
			}
		}
	}
	sets := m.availabilitySets.NewListPager(m.cfg.ResourceGroup, nil)
	for sets.More() {
		page, err := sets.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("listing availability sets: %w", err)
		}
		for _, as := range page.Value {
			if as.Name != nil {
				out.vmSets = append(out.vmSets, *as.Name)
			}
		}
	}
	nics := m.nics.NewListPager(m.cfg.ResourceGroup, nil)
	for nics.More() {
		page, err := nics.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("listing network interfaces: %w", err)
		}
		out.nics = append(out.nics, page.Value...)
	}
	return out, nil
}

// detachSteps are the steps that remove every reference to load balancer
// lb's pools: Azure refuses to delete a load balancer a VM scale set's
// model or a network interface still uses (cloud-provider-azure's safe
// delete does the same first).
func (m *Migrator) detachSteps(users *lbUsers, lb string) []MigrationStep {
	var steps []MigrationStep
	for _, ss := range users.scaleSets {
		if ss.Name == nil || !scaleSetUses(ss, lb) {
			continue
		}
		name := *ss.Name
		steps = append(steps, MigrationStep{Description: fmt.Sprintf("detach VM scale set %s from Basic load balancer %s (model and instances)", name, lb),
			do: func(ctx context.Context) error { return m.detachScaleSet(ctx, name, lb) }})
	}
	for _, nic := range users.nics {
		if nic.Name == nil || !interfaceUses(nic, lb) {
			continue
		}
		name := *nic.Name
		steps = append(steps, MigrationStep{Description: fmt.Sprintf("detach network interface %s from Basic load balancer %s", name, lb),
			do: func(ctx context.Context) error { return m.detachInterface(ctx, name, lb) }})
	}
	return steps
}

// usesLB reports whether a resource ID is one of lb's pools or NAT pools.
func usesLB(id *string, lb string) bool {
	return id != nil && strings.Contains(strings.ToLower(*id), "/loadbalancers/"+strings.ToLower(lb)+"/")
}

func scaleSetUses(ss *armcompute.VirtualMachineScaleSet, lb string) bool {
	found := false
	forEachScaleSetIPConfig(ss, func(c *armcompute.VirtualMachineScaleSetIPConfigurationProperties) {
		for _, r := range append(slices.Clone(c.LoadBalancerBackendAddressPools), c.LoadBalancerInboundNatPools...) {
			found = found || r != nil && usesLB(r.ID, lb)
		}
	})
	return found
}

func forEachScaleSetIPConfig(ss *armcompute.VirtualMachineScaleSet, f func(*armcompute.VirtualMachineScaleSetIPConfigurationProperties)) {
	if ss.Properties == nil || ss.Properties.VirtualMachineProfile == nil || ss.Properties.VirtualMachineProfile.NetworkProfile == nil {
		return
	}
	for _, nic := range ss.Properties.VirtualMachineProfile.NetworkProfile.NetworkInterfaceConfigurations {
		if nic == nil || nic.Properties == nil {
			continue
		}
		for _, ipc := range nic.Properties.IPConfigurations {
			if ipc != nil && ipc.Properties != nil {
				f(ipc.Properties)
			}
		}
	}
}

// detachScaleSet removes lb's pools from a scale set's model, with a PUT of
// only its location and network profile (as cloud-provider-azure does),
// then brings every instance to the model.
func (m *Migrator) detachScaleSet(ctx context.Context, name, lb string) error {
	// Fresh: an earlier step may have detached it from another load
	// balancer.
	resp, err := m.scaleSets.Get(ctx, m.cfg.ResourceGroup, name, nil)
	if err != nil {
		return fmt.Errorf("reading VM scale set %s: %w", name, err)
	}
	ss := resp.VirtualMachineScaleSet
	if !scaleSetUses(&ss, lb) {
		return nil
	}
	keep := func(refs []*armcompute.SubResource) []*armcompute.SubResource {
		return slices.DeleteFunc(refs, func(r *armcompute.SubResource) bool { return r == nil || usesLB(r.ID, lb) })
	}
	forEachScaleSetIPConfig(&ss, func(c *armcompute.VirtualMachineScaleSetIPConfigurationProperties) {
		c.LoadBalancerBackendAddressPools, c.LoadBalancerInboundNatPools = keep(c.LoadBalancerBackendAddressPools), keep(c.LoadBalancerInboundNatPools)
	})
	update := armcompute.VirtualMachineScaleSet{Location: ss.Location, Properties: &armcompute.VirtualMachineScaleSetProperties{
		VirtualMachineProfile: &armcompute.VirtualMachineScaleSetVMProfile{NetworkProfile: ss.Properties.VirtualMachineProfile.NetworkProfile}}}
	p, err := m.scaleSets.BeginCreateOrUpdate(ctx, m.cfg.ResourceGroup, name, update, nil)
	if err == nil {
		_, err = p.PollUntilDone(ctx, pollOpts)
	}
	if err != nil {
		return fmt.Errorf("updating the model of VM scale set %s: %w", name, err)
	}
	all := armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: []*string{ptr("*")}}
	u, err := m.scaleSets.BeginUpdateInstances(ctx, m.cfg.ResourceGroup, name, all, nil)
	if err == nil {
		_, err = u.PollUntilDone(ctx, pollOpts)
	}
	if err != nil {
		return fmt.Errorf("updating the instances of VM scale set %s: %w", name, err)
	}
	return nil
}

func interfaceUses(nic *armnetwork.Interface, lb string) bool {
	if nic.Properties == nil {
		return false
	}
	for _, ipc := range nic.Properties.IPConfigurations {
		if ipc == nil || ipc.Properties == nil {
			continue
		}
		for _, p := range ipc.Properties.LoadBalancerBackendAddressPools {
			if p != nil && usesLB(p.ID, lb) {
				return true
			}
		}
		for _, r := range ipc.Properties.LoadBalancerInboundNatRules {
			if r != nil && usesLB(r.ID, lb) {
				return true
			}
		}
	}
	return false
}

// detachInterface removes lb's pools and NAT rules from a network
// interface (an availability-set VM's).
func (m *Migrator) detachInterface(ctx context.Context, name, lb string) error {
	resp, err := m.nics.Get(ctx, m.cfg.ResourceGroup, name, nil)
	if err != nil {
		return fmt.Errorf("reading network interface %s: %w", name, err)
	}
	nic := resp.Interface
	if !interfaceUses(&nic, lb) {
		return nil
	}
	for _, ipc := range nic.Properties.IPConfigurations {
		if ipc == nil || ipc.Properties == nil {
			continue
		}
		ipc.Properties.LoadBalancerBackendAddressPools = slices.DeleteFunc(ipc.Properties.LoadBalancerBackendAddressPools,
			func(p *armnetwork.BackendAddressPool) bool { return p == nil || usesLB(p.ID, lb) })
		ipc.Properties.LoadBalancerInboundNatRules = slices.DeleteFunc(ipc.Properties.LoadBalancerInboundNatRules,
			func(r *armnetwork.InboundNatRule) bool { return r == nil || usesLB(r.ID, lb) })
	}
	p, err := m.nics.BeginCreateOrUpdate(ctx, m.cfg.ResourceGroup, name, nic, nil)
	if err == nil {
		_, err = p.PollUntilDone(ctx, pollOpts)
	}
	if err != nil {
		return fmt.Errorf("updating network interface %s: %w", name, err)
	}
	return nil
}
