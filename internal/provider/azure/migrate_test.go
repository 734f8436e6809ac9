package azure

import (
	"context"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"

	"github.com/ebbdev/ebb/internal/provider/azure/azurefake"
)

func basicNetwork() *azurefake.Network {
	n := azurefake.NewNetwork()
	pipID := "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/publicIPAddresses/pip-a"
	n.AddPublicIP(armnetwork.PublicIPAddress{Name: ptr("pip-a"), ID: &pipID, SKU: &armnetwork.PublicIPAddressSKU{Name: ptr(armnetwork.PublicIPAddressSKUNameBasic)},
		Properties: &armnetwork.PublicIPAddressPropertiesFormat{IPAddress: ptr("20.0.0.1"), PublicIPAllocationMethod: ptr(armnetwork.IPAllocationMethodDynamic)}})
	basic := &armnetwork.LoadBalancerSKU{Name: ptr(armnetwork.LoadBalancerSKUNameBasic)}
	n.AddLoadBalancer(armnetwork.LoadBalancer{Name: ptr("kubernetes"), SKU: basic, Properties: &armnetwork.LoadBalancerPropertiesFormat{
		FrontendIPConfigurations: []*armnetwork.FrontendIPConfiguration{{Name: ptr("fe-a"), ID: ptr("fe-a-id"), Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{PublicIPAddress: &armnetwork.PublicIPAddress{ID: &pipID}}}}}})
	n.AddLoadBalancer(armnetwork.LoadBalancer{Name: ptr("kubernetes-internal"), SKU: basic, Properties: &armnetwork.LoadBalancerPropertiesFormat{
		FrontendIPConfigurations: []*armnetwork.FrontendIPConfiguration{{Name: ptr("fe-b"), Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{PrivateIPAddress: ptr("10.1.0.5")}}}}})
	return n
}

var (
	services = []ServiceAddress{{Namespace: "shop", Name: "web", IP: "20.0.0.1"}, {Namespace: "shop", Name: "db", IP: "10.1.0.5", Internal: true}}
	nodeIPs  = []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}
)

func migrator(t *testing.T, n *azurefake.Network) *Migrator {
	t.Helper()
	cfg, err := ParseConfig([]byte(`{"tenantId":"t","subscriptionId":"s","resourceGroup":"rg","useManagedIdentityExtension":true}`))
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMigrator(cfg, azurefake.Credential{}, n.ClientOptions())
	if err != nil {
		t.Fatal(err)
	}
	m.Location, m.SubnetID, m.VNetID = "westeurope", "subnet-id", "vnet-id"
	return m
}

// The whole migration, interrupted by a failure between steps: the re-run
// does only what is left, every Service keeps its address, and a third run
// changes nothing.
func TestMigrateBasicToStandard(t *testing.T) {
	n := basicNetwork()
	m := migrator(t, n)
	ctx := context.Background()
	steps, err := m.Plan(ctx, services, nodeIPs)
	if err != nil {
		t.Fatal(err)
	}
	var descs []string
	for _, s := range steps {
		descs = append(descs, s.Description)
	}
	want := []string{"delete Basic load balancer kubernetes ", "delete Basic load balancer kubernetes-internal", "upgrade public IP pip-a", "create Standard load balancer kubernetes ", "create Standard load balancer kubernetes-internal"}
	if len(steps) != len(want) {
		t.Fatalf("plan:\n%s", strings.Join(descs, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(descs[i], want[i]) {
			t.Errorf("step %d: %q, want %q...", i+1, descs[i], want[i])
		}
	}

	n.FailOn["pip-put"] = 1 // the run stops after the deletions
	if err := m.Run(ctx, steps, func(string) {}); err == nil || !strings.Contains(err.Error(), "run the migration again to resume") {
		t.Fatalf("the interrupted run: %v", err)
	}
	steps, err = m.Plan(ctx, services, nodeIPs)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 3 {
		t.Fatalf("%d steps after the crash, want 3 (the deletions are done)", len(steps))
	}
	if err := m.Run(ctx, steps, func(string) {}); err != nil {
		t.Fatal(err)
	}

	pip := n.PublicIP("pip-a")
	if *pip.SKU.Name != armnetwork.PublicIPAddressSKUNameStandard || *pip.Properties.IPAddress != "20.0.0.1" {
		t.Errorf("public IP after the migration: %v %v", *pip.SKU.Name, *pip.Properties.IPAddress)
	}
	ext, ok := n.LoadBalancer("kubernetes")
	if !ok || *ext.SKU.Name != armnetwork.LoadBalancerSKUNameStandard || *ext.Properties.FrontendIPConfigurations[0].Properties.PublicIPAddress.ID != *pip.ID {
		t.Errorf("external load balancer: %+v", ext)
	}
	if got := len(ext.Properties.BackendAddressPools[0].Properties.LoadBalancerBackendAddresses); got != 3 {
		t.Errorf("%d nodes in the backend pool, want 3", got)
	}
	in, ok := n.LoadBalancer("kubernetes-internal")
	if !ok || *in.Properties.FrontendIPConfigurations[0].Properties.PrivateIPAddress != "10.1.0.5" {
		t.Errorf("internal load balancer: %+v", in)
	}
	if steps, err := m.Plan(ctx, services, nodeIPs); err != nil || len(steps) != 0 {
		t.Errorf("a run after the migration plans %d steps (%v), want none", len(steps), err)
	}
}

func TestMigrateRefusesToLoseAnAddress(t *testing.T) {
	m := migrator(t, basicNetwork())
	_, err := m.Plan(context.Background(), []ServiceAddress{{Namespace: "x", Name: "y", IP: "20.9.9.9"}}, nodeIPs)
	if err == nil || !strings.Contains(err.Error(), "no public IP") {
		t.Errorf("%v", err)
	}
}
