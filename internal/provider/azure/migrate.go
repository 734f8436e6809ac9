package azure

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

// ServiceAddress is a LoadBalancer Service's address to keep.
type ServiceAddress struct {
	Namespace, Name string
	IP              string
	// Internal Services' addresses are private, on the internal load
	// balancer; external ones are public IPs.
	Internal bool
	// Pinned says the Service already asks for this address
	// (spec.loadBalancerIP or cloud-provider-azure's
	// azure-load-balancer-ipv4/ipv6 annotation), so cloud-provider-azure
	// gives it the same one on the Standard load balancer.
	Pinned bool
}

// MigrationStep is one change of the Basic-to-Standard migration.
type MigrationStep struct {
	Description string
	do          func(ctx context.Context) error
}

// Migrator plans and runs the Basic to Standard migration of the design,
// leaving to cloud-provider-azure what it builds itself: every Service's
// address is made to survive (Dynamic public IPs become Static, each
// Service is pinned to its address), the Basic load balancers are deleted
// safely (the VM scale sets and network interfaces that reference their
// pools are detached first, as Azure requires), and the public IPs are
// upgraded to Standard. cloud-provider-azure, with loadBalancerSku
// standard, then builds the Standard load balancers as it always does
// (frontends, pools, rules and probes of its own making), so its next
// reconcile has nothing to fight. The plan is computed from what exists,
// so a re-run or a run after a crash does only what is left.
type Migrator struct {
	cfg       *Config
	lbs       *armnetwork.LoadBalancersClient
	pips      *armnetwork.PublicIPAddressesClient
	nics      *armnetwork.InterfacesClient
	scaleSets *armcompute.VirtualMachineScaleSetsClient
	// Pin makes a Service ask for its current address; nil plans no
	// pinning (the Services are pinned already, or by hand).
	Pin func(ctx context.Context, s ServiceAddress) error
}

// NewMigrator returns a Migrator.
func NewMigrator(cfg *Config, cred azcore.TokenCredential, opts *arm.ClientOptions) (*Migrator, error) {
	lbs, err := armnetwork.NewLoadBalancersClient(cfg.SubscriptionID, cred, opts)
	if err != nil {
		return nil, err
	}
	pips, err := armnetwork.NewPublicIPAddressesClient(cfg.SubscriptionID, cred, opts)
	if err != nil {
		return nil, err
	}
	nics, err := armnetwork.NewInterfacesClient(cfg.SubscriptionID, cred, opts)
	if err != nil {
		return nil, err
	}
	scaleSets, err := armcompute.NewVirtualMachineScaleSetsClient(cfg.SubscriptionID, cred, opts)
	if err != nil {
		return nil, err
	}
	return &Migrator{cfg: cfg, lbs: lbs, pips: pips, nics: nics, scaleSets: scaleSets}, nil
}

// Plan lists the steps still needed: addresses made to survive, Basic load
// balancers detached and deleted, public IPs upgraded.
func (m *Migrator) Plan(ctx context.Context, services []ServiceAddress) ([]MigrationStep, error) {
	sort.Slice(services, func(i, j int) bool {
		return services[i].Namespace+"/"+services[i].Name < services[j].Namespace+"/"+services[j].Name
	})
	pipByIP, err := m.publicIPs(ctx)
	if err != nil {
		return nil, err
	}
	var keep, upgrade []MigrationStep
	for _, s := range services {
		if !s.Internal {
			pip, ok := pipByIP[s.IP]
			if !ok {
				return nil, fmt.Errorf("the Service %s/%s has address %s but no public IP in resource group %s has it: the migration would lose it", s.Namespace, s.Name, s.IP, m.cfg.ResourceGroup)
			}
			p := *pip
			if isBasicPIP(p.SKU) && !isStatic(&p) {
				keep = append(keep, MigrationStep{Description: fmt.Sprintf("make public IP %s (%s, Service %s/%s) Static, in place: a Dynamic address is released when its load balancer goes", *p.Name, s.IP, s.Namespace, s.Name),
					do: func(ctx context.Context) error { return m.makeStatic(ctx, p) }})
			}
			if isBasicPIP(p.SKU) {
				upgrade = append(upgrade, MigrationStep{Description: fmt.Sprintf("upgrade public IP %s (%s, Service %s/%s) to the Standard SKU", *p.Name, s.IP, s.Namespace, s.Name),
					do: func(ctx context.Context) error { return m.upgradePIP(ctx, *p.Name) }})
			}
		}
		if !s.Pinned && m.Pin != nil {
			s := s
			keep = append(keep, MigrationStep{Description: fmt.Sprintf("pin Service %s/%s to its address %s, so that cloud-provider-azure gives it the same one", s.Namespace, s.Name, s.IP),
				do: func(ctx context.Context) error { return m.Pin(ctx, s) }})
		}
	}
	steps := keep
	var users *lbUsers // read once, when a Basic load balancer is found
	for _, lbName := range m.cfg.AdminStateLoadBalancers() {
		lb, found, err := m.getLB(ctx, lbName)
		if err != nil {
			return nil, err
		}
		if !found || !isBasic(lb.SKU) {
			continue
		}
		if users == nil {
			if users, err = m.lbUsers(ctx); err != nil {
				return nil, err
			}
		}
		steps = append(steps, m.detachSteps(users, lbName)...)
		name := lbName
		steps = append(steps, MigrationStep{Description: fmt.Sprintf("delete Basic load balancer %s", name), do: func(ctx context.Context) error {
			return m.deleteLB(ctx, name)
		}})
	}
	return append(steps, upgrade...), nil
}

// lbUsers are what may reference a load balancer's pools: the resource
// group's VM scale sets and network interfaces.
type lbUsers struct {
	scaleSets []*armcompute.VirtualMachineScaleSet
	nics      []*armnetwork.Interface
}

func (m *Migrator) lbUsers(ctx context.Context) (*lbUsers, error) {
	out := &lbUsers{}
	sets := m.scaleSets.NewListPager(m.cfg.ResourceGroup, nil)
	for sets.More() {
		page, err := sets.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("listing VM scale sets: %w", err)
		}
		out.scaleSets = append(out.scaleSets, page.Value...)
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

// Run runs the steps in order, stopping at the first failure (a re-run
// resumes).
func (m *Migrator) Run(ctx context.Context, steps []MigrationStep, progress func(string)) error {
	for i, s := range steps {
		progress(fmt.Sprintf("[%d/%d] %s", i+1, len(steps), s.Description))
		if err := s.do(ctx); err != nil {
			return fmt.Errorf("step %d (%s): %w; run the migration again to resume", i+1, s.Description, err)
		}
	}
	return nil
}

func (m *Migrator) publicIPs(ctx context.Context) (map[string]*armnetwork.PublicIPAddress, error) {
	out := map[string]*armnetwork.PublicIPAddress{}
	pager := m.pips.NewListPager(m.cfg.ResourceGroup, nil)
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("listing public IPs: %w", err)
		}
		for _, p := range page.Value {
			if p.Properties != nil && p.Properties.IPAddress != nil {
				out[*p.Properties.IPAddress] = p
			}
		}
	}
	return out, nil
}

func (m *Migrator) getLB(ctx context.Context, name string) (armnetwork.LoadBalancer, bool, error) {
	resp, err := m.lbs.Get(ctx, m.cfg.LoadBalancerResourceGroup, name, nil)
	if isNotFound(err) {
		return armnetwork.LoadBalancer{}, false, nil
	}
	if err != nil {
		return armnetwork.LoadBalancer{}, false, fmt.Errorf("reading load balancer %s: %w", name, err)
	}
	return resp.LoadBalancer, true, nil
}

var pollOpts = &runtime.PollUntilDoneOptions{Frequency: time.Second}

func (m *Migrator) deleteLB(ctx context.Context, name string) error {
	p, err := m.lbs.BeginDelete(ctx, m.cfg.LoadBalancerResourceGroup, name, nil)
	if err == nil {
		_, err = p.PollUntilDone(ctx, pollOpts)
	}
	return err
}

// makeStatic keeps a Basic public IP's address: changing the allocation
// to Static in place is allowed while it is attached, and the address
// stays.
func (m *Migrator) makeStatic(ctx context.Context, pip armnetwork.PublicIPAddress) error {
	if pip.Properties == nil {
		pip.Properties = &armnetwork.PublicIPAddressPropertiesFormat{}
	}
	pip.Properties.PublicIPAllocationMethod = ptr(armnetwork.IPAllocationMethodStatic)
	return m.putPIP(ctx, pip)
}

// upgradePIP moves a detached public IP to the Standard SKU (Static, as
// Standard requires), reading it afresh: its load balancer is gone.
func (m *Migrator) upgradePIP(ctx context.Context, name string) error {
	resp, err := m.pips.Get(ctx, m.cfg.ResourceGroup, name, nil)
	if err != nil {
		return fmt.Errorf("reading public IP %s: %w", name, err)
	}
	pip := resp.PublicIPAddress
	if pip.Properties == nil || pip.Properties.IPAddress == nil {
		return fmt.Errorf("public IP %s has no address any more (it was Dynamic and its load balancer is gone): its Service's address is lost; give the Service a new one", name)
	}
	pip.SKU = &armnetwork.PublicIPAddressSKU{Name: ptr(armnetwork.PublicIPAddressSKUNameStandard)}
	pip.Properties.PublicIPAllocationMethod = ptr(armnetwork.IPAllocationMethodStatic)
	return m.putPIP(ctx, pip)
}

func (m *Migrator) putPIP(ctx context.Context, pip armnetwork.PublicIPAddress) error {
	p, err := m.pips.BeginCreateOrUpdate(ctx, m.cfg.ResourceGroup, *pip.Name, pip, nil)
	if err == nil {
		_, err = p.PollUntilDone(ctx, pollOpts)
	}
	if err != nil {
		return fmt.Errorf("updating public IP %s: %w", *pip.Name, err)
	}
	return nil
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

func isStatic(p *armnetwork.PublicIPAddress) bool {
	return p.Properties != nil && p.Properties.PublicIPAllocationMethod != nil && *p.Properties.PublicIPAllocationMethod == armnetwork.IPAllocationMethodStatic
}

func isBasic(s *armnetwork.LoadBalancerSKU) bool {
	return s == nil || s.Name == nil || strings.EqualFold(string(*s.Name), string(armnetwork.LoadBalancerSKUNameBasic))
}

func isBasicPIP(s *armnetwork.PublicIPAddressSKU) bool {
	return s == nil || s.Name == nil || strings.EqualFold(string(*s.Name), string(armnetwork.PublicIPAddressSKUNameBasic))
}

func ptr[T any](v T) *T { return &v }
