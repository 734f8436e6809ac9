package azure

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

// ServiceAddress is a LoadBalancer Service's address to keep.
type ServiceAddress struct {
	Namespace, Name string
	IP              string
	// Internal Services get a private frontend on the internal load
	// balancer; external ones keep their public IP.
	Internal bool
}

// MigrationStep is one change of the Basic-to-Standard migration.
type MigrationStep struct {
	Description string
	do          func(ctx context.Context) error
}

// Migrator plans and runs the Basic to Standard migration of the design:
// the Basic load balancers go, their public IPs are upgraded to Standard
// in place, and Standard load balancers serve every Service's address
// with every node in their backend pool. The plan is computed from what
// exists, so a re-run or a run after a crash does only what is left.
type Migrator struct {
	cfg  *Config
	lbs  *armnetwork.LoadBalancersClient
	pips *armnetwork.PublicIPAddressesClient
	// Location of the load balancers to create.
	Location string
	// SubnetID of internal frontends and VNetID of the IP-based pools.
	SubnetID, VNetID string
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
	return &Migrator{cfg: cfg, lbs: lbs, pips: pips}, nil
}

func (m *Migrator) names() (external, internal string) {
	base := m.cfg.LoadBalancerNames()[0]
	return base, base + "-internal"
}

// Plan lists the steps still needed to serve services from Standard load
// balancers with every node (by address) in their backend pools.
func (m *Migrator) Plan(ctx context.Context, services []ServiceAddress, nodeIPs []string) ([]MigrationStep, error) {
	sort.Slice(services, func(i, j int) bool {
		return services[i].Namespace+"/"+services[i].Name < services[j].Namespace+"/"+services[j].Name
	})
	pipByIP, err := m.publicIPs(ctx)
	if err != nil {
		return nil, err
	}
	var steps []MigrationStep
	ext, in := m.names()
	for _, lbName := range []string{ext, in} {
		lb, found, err := m.getLB(ctx, lbName)
		if err != nil {
			return nil, err
		}
		if found && isBasic(lb.SKU) {
			name := lbName
			steps = append(steps, MigrationStep{Description: fmt.Sprintf("delete Basic load balancer %s (its nodes and public IPs are released)", name), do: func(ctx context.Context) error {
				return m.deleteLB(ctx, name)
			}})
		}
	}
	var extFE, inFE []*armnetwork.FrontendIPConfiguration
	for _, s := range services {
		feName := fmt.Sprintf("%s-%s", s.Namespace, s.Name)
		if s.Internal {
			ip := s.IP
			inFE = append(inFE, &armnetwork.FrontendIPConfiguration{Name: &feName, Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{
				PrivateIPAddress: &ip, PrivateIPAllocationMethod: ptr(armnetwork.IPAllocationMethodStatic), Subnet: &armnetwork.Subnet{ID: &m.SubnetID}}})
			continue
		}
		pip, ok := pipByIP[s.IP]
		if !ok {
			return nil, fmt.Errorf("the Service %s/%s has address %s but no public IP in resource group %s has it: the migration would lose it", s.Namespace, s.Name, s.IP, m.cfg.ResourceGroup)
		}
		if isBasicPIP(pip.SKU) {
			p := *pip
			steps = append(steps, MigrationStep{Description: fmt.Sprintf("upgrade public IP %s (%s, Service %s/%s) to the Standard SKU in place", *p.Name, s.IP, s.Namespace, s.Name), do: func(ctx context.Context) error {
				return m.upgradePIP(ctx, p)
			}})
		}
		extFE = append(extFE, &armnetwork.FrontendIPConfiguration{Name: &feName, Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{
			PublicIPAddress: &armnetwork.PublicIPAddress{ID: pip.ID}}})
	}
	for _, want := range []struct {
		name string
		fes  []*armnetwork.FrontendIPConfiguration
	}{{ext, extFE}, {in, inFE}} {
		if len(want.fes) == 0 {
			continue
		}
		lb, found, err := m.getLB(ctx, want.name)
		if err != nil {
			return nil, err
		}
		if found && !isBasic(lb.SKU) && m.complete(lb, want.fes, nodeIPs) {
			continue
		}
		target := m.standardLB(want.name, want.fes, nodeIPs)
		steps = append(steps, MigrationStep{Description: fmt.Sprintf("create Standard load balancer %s with %d frontend(s) and %d node(s) in its backend pool", want.name, len(want.fes), len(nodeIPs)), do: func(ctx context.Context) error {
			return m.putLB(ctx, target)
		}})
	}
	return steps, nil
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

func (m *Migrator) standardLB(name string, fes []*armnetwork.FrontendIPConfiguration, nodeIPs []string) armnetwork.LoadBalancer {
	pool := "kubernetes"
	var addrs []*armnetwork.LoadBalancerBackendAddress
	for _, ip := range nodeIPs {
		ip := ip
		addrs = append(addrs, &armnetwork.LoadBalancerBackendAddress{Name: &ip, Properties: &armnetwork.LoadBalancerBackendAddressPropertiesFormat{
			IPAddress: &ip, VirtualNetwork: &armnetwork.SubResource{ID: &m.VNetID}}})
	}
	return armnetwork.LoadBalancer{
		Name: &name, Location: &m.Location, SKU: &armnetwork.LoadBalancerSKU{Name: ptr(armnetwork.LoadBalancerSKUNameStandard)},
		Properties: &armnetwork.LoadBalancerPropertiesFormat{
			FrontendIPConfigurations: fes,
			BackendAddressPools:      []*armnetwork.BackendAddressPool{{Name: &pool, Properties: &armnetwork.BackendAddressPoolPropertiesFormat{LoadBalancerBackendAddresses: addrs}}},
		},
	}
}

// complete reports whether a Standard load balancer already has every
// wanted frontend and node.
func (m *Migrator) complete(lb armnetwork.LoadBalancer, fes []*armnetwork.FrontendIPConfiguration, nodeIPs []string) bool {
	if lb.Properties == nil {
		return false
	}
	have := map[string]bool{}
	for _, fe := range lb.Properties.FrontendIPConfigurations {
		have[*fe.Name] = true
	}
	for _, fe := range fes {
		if !have[*fe.Name] {
			return false
		}
	}
	nodes := map[string]bool{}
	for _, p := range lb.Properties.BackendAddressPools {
		if p.Properties == nil {
			continue
		}
		for _, a := range p.Properties.LoadBalancerBackendAddresses {
			if a.Properties != nil && a.Properties.IPAddress != nil {
				nodes[*a.Properties.IPAddress] = true
			}
		}
	}
	for _, ip := range nodeIPs {
		if !nodes[ip] {
			return false
		}
	}
	return true
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
	var rerr *azcore.ResponseError
	if errors.As(err, &rerr) && rerr.StatusCode == http.StatusNotFound {
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

func (m *Migrator) putLB(ctx context.Context, lb armnetwork.LoadBalancer) error {
	p, err := m.lbs.BeginCreateOrUpdate(ctx, m.cfg.LoadBalancerResourceGroup, *lb.Name, lb, nil)
	if err == nil {
		_, err = p.PollUntilDone(ctx, pollOpts)
	}
	return err
}

func (m *Migrator) upgradePIP(ctx context.Context, pip armnetwork.PublicIPAddress) error {
	pip.SKU = &armnetwork.PublicIPAddressSKU{Name: ptr(armnetwork.PublicIPAddressSKUNameStandard)}
	if pip.Properties == nil {
		pip.Properties = &armnetwork.PublicIPAddressPropertiesFormat{}
	}
	pip.Properties.PublicIPAllocationMethod = ptr(armnetwork.IPAllocationMethodStatic) // Standard requires static; the address stays
	p, err := m.pips.BeginCreateOrUpdate(ctx, m.cfg.ResourceGroup, *pip.Name, pip, nil)
	if err == nil {
		_, err = p.PollUntilDone(ctx, pollOpts)
	}
	return err
}

func isBasic(s *armnetwork.LoadBalancerSKU) bool {
	return s == nil || s.Name == nil || strings.EqualFold(string(*s.Name), string(armnetwork.LoadBalancerSKUNameBasic))
}

func isBasicPIP(s *armnetwork.PublicIPAddressSKU) bool {
	return s == nil || s.Name == nil || strings.EqualFold(string(*s.Name), string(armnetwork.PublicIPAddressSKUNameBasic))
}

func ptr[T any](v T) *T { return &v }
