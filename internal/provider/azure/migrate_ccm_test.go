package azure

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"

	"github.com/ebbdev/ebb/internal/provider/azure/azurefake"
)

// ccmServices are basicNetwork's Services as cloud-provider-azure serves
// them, pinned to their addresses.
func ccmServices() []azurefake.CCMService {
	return []azurefake.CCMService{
		{Name: "shop/web", FrontendName: "fe-a", IP: "20.0.0.1"},
		{Name: "shop/db", FrontendName: "fe-b", IP: "10.1.0.5", Internal: true},
	}
}

// While azure.json still says Basic, the migration runs only the steps
// that keep the addresses, and a cloud-controller-manager still on Basic
// has nothing to build again: the design's order is SKU, restart, then
// migrate (issue 50 item 19). Before, the migration deleted the Basic load
// balancers under a Basic cloud-controller-manager, which created them
// again at its next reconcile.
func TestMigrationWaitsForTheStandardSKU(t *testing.T) {
	n := basicNetwork()
	pinned := map[string]string{}
	m := migratorWithSKU(t, n, pinned, "basic")
	ccm := &azurefake.CloudControllerManager{Network: n, SKU: "basic", Cluster: "kubernetes", Services: ccmServices()}
	ctx := context.Background()
	if !m.WaitsForStandard() {
		t.Fatal("a Basic azure.json does not make the migration wait")
	}
	steps, err := m.Plan(ctx, services(pinned))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range descriptions(steps) {
		if !strings.HasPrefix(d, "make public IP") && !strings.HasPrefix(d, "pin Service") {
			t.Errorf("with a Basic azure.json the plan has %q", d)
		}
	}
	if err := m.Run(ctx, steps, func(string) { ccm.Reconcile() }); err != nil {
		t.Fatal(err)
	}
	ccm.Reconcile()
	if len(ccm.Errors) > 0 {
		t.Errorf("the Basic cloud-controller-manager failed: %v", ccm.Errors)
	}
	for _, name := range []string{"kubernetes", "kubernetes-internal"} {
		if lb, ok := n.LoadBalancer(name); !ok || *lb.SKU.Name != armnetwork.LoadBalancerSKUNameBasic {
			t.Errorf("load balancer %s changed while azure.json says Basic", name)
		}
	}
	if pinned["shop/web"] != "20.0.0.1" {
		t.Errorf("pinned %v: the addresses are not kept before the SKU changes", pinned)
	}
}

// A cluster with more than its primary VM set: cloud-provider-azure named
// a Basic load balancer after a second scale set and one after an
// availability set; a user's own Basic load balancer is not the
// cluster's.
func multiVMSetNetwork() *azurefake.Network {
	n := basicNetwork()
	basic := &armnetwork.LoadBalancerSKU{Name: ptr(armnetwork.LoadBalancerSKUNameBasic)}
	for _, x := range []struct{ lb, pip, ip, fe string }{{"pool2", "pip-c", "20.0.0.3", "fe-c"}, {"as1", "pip-d", "20.0.0.4", "fe-d"}, {"user-basic", "pip-u", "20.0.0.9", "fe-u"}} {
		pipID := netPrefix + "publicIPAddresses/" + x.pip
		n.AddPublicIP(armnetwork.PublicIPAddress{Name: ptr(x.pip), ID: &pipID, SKU: &armnetwork.PublicIPAddressSKU{Name: ptr(armnetwork.PublicIPAddressSKUNameBasic)},
			Properties: &armnetwork.PublicIPAddressPropertiesFormat{IPAddress: ptr(x.ip), PublicIPAllocationMethod: ptr(armnetwork.IPAllocationMethodStatic)}})
		n.AddLoadBalancer(armnetwork.LoadBalancer{Name: ptr(x.lb), SKU: basic, Properties: &armnetwork.LoadBalancerPropertiesFormat{
			FrontendIPConfigurations: []*armnetwork.FrontendIPConfiguration{{Name: ptr(x.fe), Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{PublicIPAddress: &armnetwork.PublicIPAddress{ID: &pipID}}}}}})
	}
	n.AddLoadBalancer(armnetwork.LoadBalancer{Name: ptr("pool2-internal"), SKU: basic, Location: ptr("westeurope"), Properties: &armnetwork.LoadBalancerPropertiesFormat{
		FrontendIPConfigurations: []*armnetwork.FrontendIPConfiguration{{Name: ptr("fe-e"), Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{PrivateIPAddress: ptr("10.1.0.7")}}}}})
	n.AddScaleSet(armcompute.VirtualMachineScaleSet{Name: ptr("pool2"), Location: ptr("westeurope"), Properties: &armcompute.VirtualMachineScaleSetProperties{
		VirtualMachineProfile: &armcompute.VirtualMachineScaleSetVMProfile{NetworkProfile: &armcompute.VirtualMachineScaleSetNetworkProfile{
			NetworkInterfaceConfigurations: []*armcompute.VirtualMachineScaleSetNetworkConfiguration{{Name: ptr("nic"), Properties: &armcompute.VirtualMachineScaleSetNetworkConfigurationProperties{
				IPConfigurations: []*armcompute.VirtualMachineScaleSetIPConfiguration{{Name: ptr("ipconfig1"), Properties: &armcompute.VirtualMachineScaleSetIPConfigurationProperties{
					LoadBalancerBackendAddressPools: []*armcompute.SubResource{{ID: poolID("pool2")}, {ID: poolID("pool2-internal")}},
				}}},
			}}},
		}}}})
	n.AddAvailabilitySet("as1")
	n.AddInterface(armnetwork.Interface{Name: ptr("vm-as1-0-nic"), Properties: &armnetwork.InterfacePropertiesFormat{IPConfigurations: []*armnetwork.InterfaceIPConfiguration{{
		Name: ptr("ipconfig1"), Properties: &armnetwork.InterfaceIPConfigurationPropertiesFormat{LoadBalancerBackendAddressPools: []*armnetwork.BackendAddressPool{{ID: poolID("as1")}}},
	}}}})
	return n
}

// The migration against a cloud-controller-manager on Standard that
// reconciles between every two of its steps, after another deployment in
// the subnet asked for the internal Service's address each time: every
// Basic load balancer of the cluster goes (also those named after the
// other VM sets; before, only the primary's), the user's stays, and at the
// end the cloud-controller-manager builds its Standard load balancers with
// every Service's address, the internal one included (before, its private
// IP was free between the deletion and the next reconcile, and the other
// deployment took it).
func TestMigrationAgainstACompetingCloudControllerManager(t *testing.T) {
	n := multiVMSetNetwork()
	pinned := map[string]string{}
	m := migrator(t, n, pinned)
	ccm := &azurefake.CloudControllerManager{Network: n, SKU: "standard", Cluster: "kubernetes", Services: append(ccmServices(),
		azurefake.CCMService{Name: "shop/api", FrontendName: "fe-c", IP: "20.0.0.3"}, azurefake.CCMService{Name: "ops/dash", FrontendName: "fe-d", IP: "20.0.0.4"},
		azurefake.CCMService{Name: "ops/cache", FrontendName: "fe-e", IP: "10.1.0.7", Internal: true})}
	svcs := append(services(pinned), ServiceAddress{Namespace: "shop", Name: "api", IP: "20.0.0.3", Pinned: true}, ServiceAddress{Namespace: "ops", Name: "dash", IP: "20.0.0.4", Pinned: true},
		ServiceAddress{Namespace: "ops", Name: "cache", IP: "10.1.0.7", Internal: true, Pinned: true})
	ctx := context.Background()
	steps, err := m.Plan(ctx, svcs)
	if err != nil {
		t.Fatal(err)
	}
	var squatted []string
	between := func(step string) {
		// The other deployment first: cloud-provider-azure reconciles
		// on its own schedule, often much later.
		for _, ip := range []string{"10.1.0.5", "10.1.0.7"} {
			if n.ClaimPrivateIP("other-deployment-"+ip, ip) {
				squatted = append(squatted, ip+" before "+step)
			}
		}
		ccm.Reconcile()
	}
	if err := m.Run(ctx, steps, between); err != nil {
		t.Fatalf("%v\nplan:\n%s", err, strings.Join(descriptions(steps), "\n"))
	}
	ccm.Reconcile()
	if len(squatted) > 0 {
		t.Errorf("an internal Service's address was free, and another deployment took it: %v", squatted)
	}
	if len(ccm.Errors) > 0 {
		t.Errorf("after the migration, cloud-provider-azure fails: %v", ccm.Errors)
	}
	for _, name := range []string{"pool2", "pool2-internal", "as1"} {
		if _, ok := n.LoadBalancer(name); ok {
			t.Errorf("the Basic load balancer %s, named after a VM set of the cluster, is still there", name)
		}
	}
	if lb, ok := n.LoadBalancer("user-basic"); !ok || *lb.SKU.Name != armnetwork.LoadBalancerSKUNameBasic {
		t.Error("a user's Basic load balancer, not the cluster's, was changed")
	}
	// The internal Service of the other VM set's Basic load balancer moves
	// to the Standard one cloud-provider-azure builds for the cluster.
	want := map[string][]string{"kubernetes": {"fe-a", "fe-c", "fe-d"}, "kubernetes-internal": {"fe-b", "fe-e"}}
	for name, fes := range want {
		lb, ok := n.LoadBalancer(name)
		if !ok || *lb.SKU.Name != armnetwork.LoadBalancerSKUNameStandard {
			t.Errorf("no Standard load balancer %s at the end", name)
			continue
		}
		var got []string
		for _, fe := range lb.Properties.FrontendIPConfigurations {
			got = append(got, *fe.Name)
		}
		slices.Sort(got)
		if strings.Join(got, ",") != strings.Join(fes, ",") {
			t.Errorf("load balancer %s has frontends %v, want %v", name, got, fes)
		}
	}
}

// A run that stops between the deletion of the Basic internal load
// balancer and the creation of its Standard successor: the re-run creates
// it, with the frontend named as cloud-provider-azure names the Service's
// (the Basic one's name went with it), which cloud-provider-azure then
// adopts.
func TestInternalAddressSurvivesACrashInItsReplacement(t *testing.T) {
	n := basicNetwork()
	pinned := map[string]string{}
	m := migrator(t, n, pinned)
	ctx := context.Background()
	steps, err := m.Plan(ctx, services(pinned))
	if err != nil {
		t.Fatal(err)
	}
	n.FailOn["lb-put"] = 1
	if err := m.Run(ctx, steps, func(string) {}); err == nil {
		t.Fatal("the run did not stop at the failed creation")
	}
	if _, ok := n.LoadBalancer("kubernetes-internal"); ok {
		t.Fatal("the failure left the internal load balancer in place: nothing to resume")
	}
	steps, err = m.Plan(ctx, services(pinned))
	if err != nil {
		t.Fatal(err)
	}
	db := services(pinned)[1]
	wantStep := "create Standard load balancer kubernetes-internal holding the internal Services' addresses 10.1.0.5"
	found := false
	for _, d := range descriptions(steps) {
		found = found || strings.HasPrefix(d, wantStep)
	}
	if !found {
		t.Fatalf("the re-run's plan has no %q:\n%s", wantStep, strings.Join(descriptions(steps), "\n"))
	}
	if err := m.Run(ctx, steps, func(string) {}); err != nil {
		t.Fatal(err)
	}
	ccm := &azurefake.CloudControllerManager{Network: n, SKU: "standard", Cluster: "kubernetes", Services: []azurefake.CCMService{
		{Name: "shop/web", FrontendName: "fe-a", IP: "20.0.0.1"}, {Name: "shop/db", FrontendName: db.FrontendName(), IP: "10.1.0.5", Internal: true}}}
	ccm.Reconcile()
	if len(ccm.Errors) > 0 {
		t.Errorf("cloud-provider-azure fails after the resumed run: %v", ccm.Errors)
	}
	lb, _ := n.LoadBalancer("kubernetes-internal")
	fe := lb.Properties.FrontendIPConfigurations
	if len(fe) != 1 || *fe[0].Name != db.FrontendName() || fe[0].Properties.Subnet == nil ||
		*fe[0].Properties.Subnet.ID != "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/vnet/subnets/nodes" {
		t.Errorf("the resumed internal load balancer's frontends: %+v", fe)
	}
}

func TestFrontendName(t *testing.T) {
	const uid = "0b5c7a1e-4d2f-4c1a-9e3b-7f6d5c4b3a21"
	for _, tt := range []struct {
		name string
		s    ServiceAddress
		want string
	}{
		{"the UID without dashes, 32 characters", ServiceAddress{UID: uid, IP: "10.1.0.5", Internal: true}, "a0b5c7a1e4d2f4c1a9e3b7f6d5c4b3a2"},
		{"an internal subnet", ServiceAddress{UID: uid, IP: "10.1.0.5", Internal: true, Subnet: "apps"}, "a0b5c7a1e4d2f4c1a9e3b7f6d5c4b3a2-apps"},
		{"an external Service's subnet annotation is not used", ServiceAddress{UID: uid, IP: "20.0.0.1", Subnet: "apps"}, "a0b5c7a1e4d2f4c1a9e3b7f6d5c4b3a2"},
		{"IPv6 of a dual-stack Service", ServiceAddress{UID: uid, IP: "fd00::5", Internal: true, DualStack: true}, "a0b5c7a1e4d2f4c1a9e3b7f6d5c4b3a2-IPv6"},
		{"IPv6 single-stack", ServiceAddress{UID: uid, IP: "fd00::5", Internal: true}, "a0b5c7a1e4d2f4c1a9e3b7f6d5c4b3a2"},
		{"a long subnet is cut", ServiceAddress{UID: uid, IP: "10.1.0.5", Internal: true, Subnet: strings.Repeat("s", 60)}, "a0b5c7a1e4d2f4c1a9e3b7f6d5c4b3a2-" + strings.Repeat("s", 42)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.s.FrontendName(); got != tt.want {
				t.Errorf("FrontendName = %q, want %q", got, tt.want)
			}
		})
	}
}

// An empty loadBalancerSku waits as "basic" does: cloud-provider-azure
// took it for Basic for years.
func TestMigrationWaitsWithoutAnSKU(t *testing.T) {
	if m := migratorWithSKU(t, basicNetwork(), map[string]string{}, ""); !m.WaitsForStandard() {
		t.Error("an azure.json without loadBalancerSku does not make the migration wait")
	}
}

// The Standard internal load balancer is only created, never written over:
// if cloud-provider-azure built it meanwhile, the creation is refused and
// its pools, rules and probes stay.
func TestInternalLoadBalancerIsOnlyCreated(t *testing.T) {
	n := azurefake.NewNetwork()
	n.AddLoadBalancer(armnetwork.LoadBalancer{Name: ptr("kubernetes-internal"), SKU: &armnetwork.LoadBalancerSKU{Name: ptr(armnetwork.LoadBalancerSKUNameStandard)},
		Properties: &armnetwork.LoadBalancerPropertiesFormat{FrontendIPConfigurations: []*armnetwork.FrontendIPConfiguration{{Name: ptr("ccm-fe"),
			Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{PrivateIPAddress: ptr("10.1.0.9")}}},
			LoadBalancingRules: []*armnetwork.LoadBalancingRule{{Name: ptr("ccm-rule")}}}})
	m := migrator(t, n, map[string]string{})
	err := m.createInternal(context.Background(), "kubernetes-internal", ptr("westeurope"), []*armnetwork.FrontendIPConfiguration{{Name: ptr("fe-b"),
		Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{PrivateIPAddress: ptr("10.1.0.5")}}})
	if err == nil || !strings.Contains(err.Error(), "412") {
		t.Fatalf("creating over an existing load balancer: %v, want a 412", err)
	}
	if lb, _ := n.LoadBalancer("kubernetes-internal"); len(lb.Properties.LoadBalancingRules) != 1 || *lb.Properties.FrontendIPConfigurations[0].Name != "ccm-fe" {
		t.Errorf("cloud-provider-azure's load balancer was written over: %+v", lb.Properties)
	}
}
