package azure

import (
	"context"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"

	"github.com/ebbdev/ebb/internal/provider/azure/azurefake"
)

const netPrefix = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/"

func poolID(lb string) *string {
	return ptr(netPrefix + "loadBalancers/" + lb + "/backendAddressPools/kubernetes")
}

// A Basic cluster as cloud-provider-azure left it: an external load
// balancer whose frontend uses a Dynamic Basic public IP, an internal one,
// a VM scale set whose model references both (and a user's Standard load
// balancer, which must stay), and an availability-set VM's network
// interface in the external pool.
func basicNetwork() *azurefake.Network {
	n := azurefake.NewNetwork()
	pipID := netPrefix + "publicIPAddresses/pip-a"
	n.AddPublicIP(armnetwork.PublicIPAddress{Name: ptr("pip-a"), ID: &pipID, SKU: &armnetwork.PublicIPAddressSKU{Name: ptr(armnetwork.PublicIPAddressSKUNameBasic)},
		Properties: &armnetwork.PublicIPAddressPropertiesFormat{IPAddress: ptr("20.0.0.1"), PublicIPAllocationMethod: ptr(armnetwork.IPAllocationMethodDynamic)}})
	basic := &armnetwork.LoadBalancerSKU{Name: ptr(armnetwork.LoadBalancerSKUNameBasic)}
	n.AddLoadBalancer(armnetwork.LoadBalancer{Name: ptr("kubernetes"), SKU: basic, Properties: &armnetwork.LoadBalancerPropertiesFormat{
		FrontendIPConfigurations: []*armnetwork.FrontendIPConfiguration{{Name: ptr("fe-a"), ID: ptr("fe-a-id"), Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{PublicIPAddress: &armnetwork.PublicIPAddress{ID: &pipID}}}}}})
	n.AddLoadBalancer(armnetwork.LoadBalancer{Name: ptr("kubernetes-internal"), SKU: basic, Properties: &armnetwork.LoadBalancerPropertiesFormat{
		FrontendIPConfigurations: []*armnetwork.FrontendIPConfiguration{{Name: ptr("fe-b"), Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{PrivateIPAddress: ptr("10.1.0.5")}}}}})
	n.AddScaleSet(armcompute.VirtualMachineScaleSet{Name: ptr("pool1"), Location: ptr("westeurope"), Properties: &armcompute.VirtualMachineScaleSetProperties{
		VirtualMachineProfile: &armcompute.VirtualMachineScaleSetVMProfile{NetworkProfile: &armcompute.VirtualMachineScaleSetNetworkProfile{
			NetworkInterfaceConfigurations: []*armcompute.VirtualMachineScaleSetNetworkConfiguration{{Name: ptr("nic"), Properties: &armcompute.VirtualMachineScaleSetNetworkConfigurationProperties{
				IPConfigurations: []*armcompute.VirtualMachineScaleSetIPConfiguration{{Name: ptr("ipconfig1"), Properties: &armcompute.VirtualMachineScaleSetIPConfigurationProperties{
					LoadBalancerBackendAddressPools: []*armcompute.SubResource{{ID: poolID("kubernetes")}, {ID: poolID("kubernetes-internal")}, {ID: poolID("user-lb")}},
				}}},
			}}},
		}}}})
	n.AddInterface(armnetwork.Interface{Name: ptr("vm-as-0-nic"), Properties: &armnetwork.InterfacePropertiesFormat{IPConfigurations: []*armnetwork.InterfaceIPConfiguration{{
		Name: ptr("ipconfig1"), Properties: &armnetwork.InterfaceIPConfigurationPropertiesFormat{LoadBalancerBackendAddressPools: []*armnetwork.BackendAddressPool{{ID: poolID("kubernetes")}}},
	}}}})
	return n
}

func migrator(t *testing.T, n *azurefake.Network, pinned map[string]string) *Migrator {
	t.Helper()
	return migratorWithSKU(t, n, pinned, "standard")
}

// migratorWithSKU migrates with azure.json's loadBalancerSku set to sku.
func migratorWithSKU(t *testing.T, n *azurefake.Network, pinned map[string]string, sku string) *Migrator {
	t.Helper()
	cfg, err := ParseConfig([]byte(`{"tenantId":"t","subscriptionId":"s","resourceGroup":"rg","useManagedIdentityExtension":true,"loadBalancerSku":"` + sku + `",
		"location":"westeurope","vnetName":"vnet","subnetName":"nodes"}`))
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMigrator(cfg, azurefake.Credential{}, n.ClientOptions())
	if err != nil {
		t.Fatal(err)
	}
	m.Pin = func(_ context.Context, s ServiceAddress) error {
		pinned[s.Namespace+"/"+s.Name] = s.IP
		return nil
	}
	return m
}

// services are the cluster's addresses as the command reads them: db asks
// for its address already; web once pinned.
func services(pinned map[string]string) []ServiceAddress {
	return []ServiceAddress{
		{Namespace: "shop", Name: "web", IP: "20.0.0.1", Pinned: pinned["shop/web"] == "20.0.0.1"},
		{Namespace: "shop", Name: "db", IP: "10.1.0.5", Internal: true, Pinned: true, UID: "0b5c7a1e-4d2f-4c1a-9e3b-7f6d5c4b3a21"},
	}
}

func descriptions(steps []MigrationStep) []string {
	var out []string
	for _, s := range steps {
		out = append(out, s.Description)
	}
	return out
}

// The whole migration, interrupted by a failure between steps: addresses
// are made to survive first (the Dynamic public IP would lose its address
// with its load balancer), the Basic load balancers are deleted only after
// the scale set and the network interface are detached (the fake refuses
// otherwise, as Azure does), a user's Standard pool stays referenced, the
// public IP ends Standard with its address, the internal load balancer is
// replaced by a Standard one that holds its Service's private address; a
// re-run does only what is left and a third run nothing. No external
// Standard load balancer is built: cloud-provider-azure builds its own.
func TestMigrateBasicToStandard(t *testing.T) {
	n := basicNetwork()
	pinned := map[string]string{}
	m := migrator(t, n, pinned)
	ctx := context.Background()
	steps, err := m.Plan(ctx, services(pinned))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"make public IP pip-a (20.0.0.1, Service shop/web) Static",
		"pin Service shop/web to its address 20.0.0.1",
		"detach VM scale set pool1 from Basic load balancer kubernetes (",
		"detach network interface vm-as-0-nic from Basic load balancer kubernetes",
		"delete Basic load balancer kubernetes",
		"detach VM scale set pool1 from Basic load balancer kubernetes-internal",
		"replace Basic load balancer(s) kubernetes-internal with Standard load balancer kubernetes-internal holding their internal Services' addresses 10.1.0.5",
		"upgrade public IP pip-a",
	}
	got := descriptions(steps)
	if len(got) != len(want) {
		t.Fatalf("plan:\n%s", strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("step %d: %q, want %q...", i+1, got[i], want[i])
		}
	}

	n.FailOn["lb-delete"] = 1 // the run stops at the first deletion
	if err := m.Run(ctx, steps, func(string) {}); err == nil || !strings.Contains(err.Error(), "run the migration again to resume") {
		t.Fatalf("the interrupted run: %v", err)
	}
	steps, err = m.Plan(ctx, services(pinned))
	if err != nil {
		t.Fatal(err)
	}
	if got := descriptions(steps); len(got) != 4 || !strings.HasPrefix(got[0], "delete Basic load balancer kubernetes") {
		t.Fatalf("after the crash, want the first deletion, the internal load balancer's detach and deletion, the upgrade:\n%s", strings.Join(got, "\n"))
	}
	if err := m.Run(ctx, steps, func(string) {}); err != nil {
		t.Fatal(err)
	}

	pip := n.PublicIP("pip-a")
	if *pip.SKU.Name != armnetwork.PublicIPAddressSKUNameStandard || pip.Properties.IPAddress == nil || *pip.Properties.IPAddress != "20.0.0.1" {
		t.Errorf("public IP after the migration: %v %v", *pip.SKU.Name, pip.Properties.IPAddress)
	}
	if _, ok := n.LoadBalancer("kubernetes"); ok {
		t.Error("load balancer kubernetes is still there")
	}
	internal, ok := n.LoadBalancer("kubernetes-internal")
	if !ok || *internal.SKU.Name != armnetwork.LoadBalancerSKUNameStandard || len(internal.Properties.FrontendIPConfigurations) != 1 ||
		*internal.Properties.FrontendIPConfigurations[0].Name != "fe-b" || *internal.Properties.FrontendIPConfigurations[0].Properties.PrivateIPAddress != "10.1.0.5" {
		t.Errorf("the internal load balancer after the migration: %+v", internal)
	}
	pools := n.ScaleSet("pool1").Properties.VirtualMachineProfile.NetworkProfile.NetworkInterfaceConfigurations[0].Properties.IPConfigurations[0].Properties.LoadBalancerBackendAddressPools
	if len(pools) != 1 || *pools[0].ID != *poolID("user-lb") {
		t.Errorf("the scale set's pools after the migration: %d, want only the user's", len(pools))
	}
	if got := n.InstanceUpdates["pool1"]; got != 2 {
		t.Errorf("the scale set's instances were updated %d times, want 2 (once per load balancer)", got)
	}
	if nic := n.Interface("vm-as-0-nic"); len(nic.Properties.IPConfigurations[0].Properties.LoadBalancerBackendAddressPools) != 0 {
		t.Error("the network interface still references a Basic pool")
	}
	if pinned["shop/web"] != "20.0.0.1" || pinned["shop/db"] != "" {
		t.Errorf("pinned %v, want only shop/web (db asks for its address already)", pinned)
	}
	if steps, err := m.Plan(ctx, services(pinned)); err != nil || len(steps) != 0 {
		t.Errorf("a run after the migration plans %v (%v), want nothing", descriptions(steps), err)
	}
}

func TestMigrateRefusesToLoseAnAddress(t *testing.T) {
	m := migrator(t, basicNetwork(), map[string]string{})
	_, err := m.Plan(context.Background(), []ServiceAddress{{Namespace: "x", Name: "y", IP: "20.9.9.9"}})
	if err == nil || !strings.Contains(err.Error(), "no public IP") {
		t.Errorf("%v", err)
	}
}

// The fake behaves as Azure where the old migration went wrong: a Basic
// load balancer still referenced cannot be deleted, and a Dynamic public
// IP loses its address with its load balancer.
func TestFakeRefusesUnsafeDeletionAndReleasesDynamicAddresses(t *testing.T) {
	n := basicNetwork()
	m := migrator(t, n, map[string]string{})
	ctx := context.Background()
	if err := m.deleteLB(ctx, "kubernetes"); err == nil || !strings.Contains(err.Error(), "LoadBalancerInUseByVirtualMachineScaleSet") {
		t.Fatalf("deleting a referenced Basic load balancer: %v", err)
	}
	for _, step := range []func() error{
		func() error { return m.detachScaleSet(ctx, "pool1", "kubernetes") },
		func() error { return m.detachInterface(ctx, "vm-as-0-nic", "kubernetes") },
		func() error { return m.deleteLB(ctx, "kubernetes") },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if p := n.PublicIP("pip-a"); p.Properties.IPAddress != nil {
		t.Errorf("a Dynamic public IP kept %s after its load balancer was deleted", *p.Properties.IPAddress)
	}
	if err := m.upgradePIP(ctx, "pip-a"); err == nil || !strings.Contains(err.Error(), "no address any more") {
		t.Errorf("upgrading a public IP that lost its address: %v", err)
	}
}
