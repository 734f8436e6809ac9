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
	// UID, Subnet (its azure-load-balancer-internal-subnet annotation)
	// and DualStack name an internal Service's frontend as
	// cloud-provider-azure names it (FrontendName).
	UID       string
	Subnet    string
	DualStack bool
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
	// availabilitySets: their names name Basic load balancers too.
	availabilitySets *armcompute.AvailabilitySetsClient
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
	availabilitySets, err := armcompute.NewAvailabilitySetsClient(cfg.SubscriptionID, cred, opts)
	if err != nil {
		return nil, err
	}
	return &Migrator{cfg: cfg, lbs: lbs, pips: pips, nics: nics, scaleSets: scaleSets, availabilitySets: availabilitySets}, nil
}

// WaitsForStandard says whether azure.json does not say Standard yet. The design's
// order is SKU first, then cloud-controller-manager restarted, then the
// migration: a cloud-controller-manager still on Basic creates again the
// Basic load balancers the migration deletes. Until the SKU is Standard,
// Plan lists only the steps that keep the addresses, which a Basic
// cloud-controller-manager does not undo (and which must come before a
// Standard one reconciles, or it gives the Services new addresses).
//
// An empty loadBalancerSku waits too: cloud-provider-azure took it for
// Basic for years, and a legacy cluster's azure.json often leaves it out.
func (m *Migrator) WaitsForStandard() bool {
	return !strings.EqualFold(m.cfg.LoadBalancerSKU, "standard")
}

// Plan lists the steps still needed: addresses made to survive, every Basic
// load balancer of the cluster detached and deleted (an internal one
// replaced at once by a Standard one that holds its Services' private
// addresses), public IPs upgraded.
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
	if m.WaitsForStandard() {
		return keep, nil
	}
	lbs, err := m.loadBalancers(ctx)
	if err != nil {
		return nil, err
	}
	users, err := m.lbUsers(ctx)
	if err != nil {
		return nil, err
	}
	steps := keep
	var internals []*armnetwork.LoadBalancer
	for _, lb := range m.clusterBasics(lbs, users) {
		steps = append(steps, m.detachSteps(users, *lb.Name)...)
		if len(keptFrontends(lb, services)) > 0 {
			internals = append(internals, lb) // replaced together, below
			continue
		}
		name := *lb.Name
		steps = append(steps, MigrationStep{Description: fmt.Sprintf("delete Basic load balancer %s", name), do: func(ctx context.Context) error {
			return m.deleteLB(ctx, name)
		}})
	}
	steps = append(steps, m.internalSteps(lbs, internals, services)...)
	return append(steps, upgrade...), nil
}

// loadBalancers lists the load balancers of the load balancers' resource
// group.
func (m *Migrator) loadBalancers(ctx context.Context) ([]*armnetwork.LoadBalancer, error) {
	var out []*armnetwork.LoadBalancer
	pager := m.lbs.NewListPager(m.cfg.LoadBalancerResourceGroup, nil)
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("listing load balancers: %w", err)
		}
		out = append(out, page.Value...)
	}
	return out, nil
}

// clusterBasics are the cluster's Basic load balancers, sorted by name:
// cloud-provider-azure names a Basic cluster's load balancers after the
// cluster (the primary VM set) and after each other VM set (scale set or
// availability set), each with its "-internal" twin. A Basic load
// balancer of another name is not the cluster's and is left alone.
func (m *Migrator) clusterBasics(lbs []*armnetwork.LoadBalancer, users *lbUsers) []*armnetwork.LoadBalancer {
	own := map[string]bool{}
	for _, name := range m.cfg.LoadBalancerNames() {
		own[strings.ToLower(name)] = true
	}
	for _, name := range users.vmSets {
		own[strings.ToLower(name)] = true
	}
	var out []*armnetwork.LoadBalancer
	for _, lb := range lbs {
		if lb.Name == nil || !isBasic(lb.SKU) {
			continue
		}
		if own[strings.ToLower(strings.TrimSuffix(*lb.Name, internalSuffix))] {
			out = append(out, lb)
		}
	}
	slices.SortFunc(out, func(a, b *armnetwork.LoadBalancer) int { return strings.Compare(*a.Name, *b.Name) })
	return out
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
