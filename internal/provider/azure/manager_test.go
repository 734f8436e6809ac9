package azure

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/ebbdev/ebb/internal/provider/azure/azurefake"
)

const vmss = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/pool/virtualMachines/"

func ipEntry(ip string) *armnetwork.LoadBalancerBackendAddress {
	return &armnetwork.LoadBalancerBackendAddress{Name: &ip, Properties: &armnetwork.LoadBalancerBackendAddressPropertiesFormat{IPAddress: &ip}}
}

func nicEntry(vm string) *armnetwork.LoadBalancerBackendAddress {
	id := vmss + vm + "/networkInterfaces/nic/ipConfigurations/ipconfig1"
	return &armnetwork.LoadBalancerBackendAddress{Name: &vm, Properties: &armnetwork.LoadBalancerBackendAddressPropertiesFormat{
		NetworkInterfaceIPConfiguration: &armnetwork.SubResource{ID: &id}}}
}

func pool(name string, entries ...*armnetwork.LoadBalancerBackendAddress) armnetwork.BackendAddressPool {
	return armnetwork.BackendAddressPool{Name: &name, Properties: &armnetwork.BackendAddressPoolPropertiesFormat{LoadBalancerBackendAddresses: entries}}
}

// A cluster's default Standard load balancer with dual-stack IP-based node
// pools (cloud-provider-azure's names) and an outbound-only pool holding a
// node's address too, and its internal twin with a NIC-based node pool.
func setup(t *testing.T) (*Manager, *azurefake.Cloud) {
	t.Helper()
	cloud := azurefake.New()
	cloud.AddPool("kubernetes", pool("kubernetes", ipEntry("10.0.0.4"), ipEntry("10.0.0.5")))
	cloud.AddPool("kubernetes", pool("kubernetes-IPv6", ipEntry("fd00::4"), ipEntry("fd00::5")))
	cloud.AddPool("kubernetes", pool("aksOutboundBackendPool", ipEntry("10.0.0.4")))
	cloud.AddPool("kubernetes-internal", pool("kubernetes", nicEntry("0"), nicEntry("1")))
	return newManager(t, cloud, `{"tenantId":"t","subscriptionId":"s","resourceGroup":"rg","aadClientId":"a","aadClientSecret":"b","enableLoadBalancerAdminState":true}`), cloud
}

func newManager(t *testing.T, cloud *azurefake.Cloud, config string) *Manager {
	t.Helper()
	cfg, err := ParseConfig([]byte(config))
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := NewManager(cfg, azurefake.Credential{}, cloud.ClientOptions(), m)
	if err != nil {
		t.Fatal(err)
	}
	mgr.ThrottleBackoff = time.Millisecond
	return mgr
}

var (
	n0 = &Node{Name: "n0", IPs: []string{"10.0.0.4", "fd00::4"}, ProviderID: "azure://" + vmss + "0"}
	n1 = &Node{Name: "n1", IPs: []string{"10.0.0.5", "fd00::5"}, ProviderID: "azure://" + vmss + "1"}
)

func state(c *azurefake.Cloud, lb, p, entry string) armnetwork.LoadBalancerBackendAddressAdminState {
	for _, e := range c.Pool(lb, p).Properties.LoadBalancerBackendAddresses {
		if *e.Name == entry && e.Properties.AdminState != nil {
			return *e.Properties.AdminState
		}
	}
	return armnetwork.LoadBalancerBackendAddressAdminStateNone
}

const down, none = armnetwork.LoadBalancerBackendAddressAdminStateDown, armnetwork.LoadBalancerBackendAddressAdminStateNone

// Every entry of a node, on every load balancer, both families, IP- and
// NIC-based; several nodes in one write per pool; nothing written when
// nothing changes.
func TestSetAdminStatesBatchesAndSkips(t *testing.T) {
	mgr, cloud := setup(t)
	ctx := context.Background()
	if err := mgr.SetAdminStates(ctx, map[*Node]armnetwork.LoadBalancerBackendAddressAdminState{n0: down, n1: down}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ lb, pool, entry string }{
		{"kubernetes", "kubernetes", "10.0.0.4"}, {"kubernetes", "kubernetes", "10.0.0.5"},
		{"kubernetes", "kubernetes-IPv6", "fd00::4"}, {"kubernetes", "kubernetes-IPv6", "fd00::5"},
		{"kubernetes-internal", "kubernetes", "0"}, {"kubernetes-internal", "kubernetes", "1"},
	} {
		if got := state(cloud, c.lb, c.pool, c.entry); got != down {
			t.Errorf("%s/%s/%s: %s, want Down", c.lb, c.pool, c.entry, got)
		}
	}
	if got := state(cloud, "kubernetes", "aksOutboundBackendPool", "10.0.0.4"); got != none {
		t.Errorf("the outbound-only pool was written: %s", got)
	}
	if puts := cloud.Count("put"); puts != 3 {
		t.Errorf("%d writes for two nodes on three pools, want 3 (one per pool that changes)", puts)
	}

	if err := mgr.SetAdminStates(ctx, map[*Node]armnetwork.LoadBalancerBackendAddressAdminState{n0: down}); err != nil {
		t.Fatal(err)
	}
	if lists, puts := cloud.Count("list"), cloud.Count("put"); lists != 2 || puts != 3 {
		t.Errorf("an unchanged state cost %d lists and %d writes in total, want 2 and 3 (cached)", lists, puts)
	}
	mgr.Invalidate()
	if err := mgr.SetAdminStates(ctx, map[*Node]armnetwork.LoadBalancerBackendAddressAdminState{n0: down}); err != nil {
		t.Fatal(err)
	}
	if puts := cloud.Count("put"); puts != 3 {
		t.Errorf("a fresh read that finds everything in place wrote %d times in total, want 3", puts)
	}

	if err := mgr.SetAdminStates(ctx, map[*Node]armnetwork.LoadBalancerBackendAddressAdminState{n0: none}); err != nil {
		t.Fatal(err)
	}
	if state(cloud, "kubernetes", "kubernetes", "10.0.0.4") != none || state(cloud, "kubernetes", "kubernetes", "10.0.0.5") != down {
		t.Error("restoring n0 to None did not change only n0")
	}
}

// A concurrent writer (stale etag) is retried with a fresh read; 429s are
// retried by the SDK and counted; a failure leaves the previous state and
// the next call recovers.
func TestConflictThrottlingAndFailure(t *testing.T) {
	mgr, cloud := setup(t)
	m := mgr.m
	ctx := context.Background()
	cloud.ConflictNext = 1
	if err := mgr.SetAdminStates(ctx, map[*Node]armnetwork.LoadBalancerBackendAddressAdminState{n0: down}); err != nil {
		t.Fatalf("an etag conflict was not retried: %v", err)
	}
	if cloud.Count("get") != 1 || state(cloud, "kubernetes", "kubernetes", "10.0.0.4") != down {
		t.Errorf("after a conflict: %d fresh reads, state %s", cloud.Count("get"), state(cloud, "kubernetes", "kubernetes", "10.0.0.4"))
	}

	cloud.ThrottleNext = 2
	if err := mgr.SetAdminStates(ctx, map[*Node]armnetwork.LoadBalancerBackendAddressAdminState{n1: down}); err != nil {
		t.Fatalf("throttling was not retried: %v", err)
	}
	if got := testutil.ToFloat64(m.throttled); got != 2 {
		t.Errorf("%v throttled answers counted, want 2", got)
	}

	cloud.FailNext = 1
	err := mgr.SetAdminStates(ctx, map[*Node]armnetwork.LoadBalancerBackendAddressAdminState{n0: none})
	if err == nil || !strings.Contains(err.Error(), "InvalidRequest") {
		t.Fatalf("a failed write: %v", err)
	}
	if testutil.ToFloat64(m.errors) != 1 {
		t.Error("the failure was not counted")
	}
	if err := mgr.SetAdminStates(ctx, map[*Node]armnetwork.LoadBalancerBackendAddressAdminState{n0: none}); err != nil {
		t.Fatalf("no recovery after a failure: %v", err)
	}
	for _, p := range []string{"kubernetes", "kubernetes-IPv6"} {
		for _, e := range []string{"10.0.0.4", "fd00::4"} {
			if strings.Contains(e, ":") != strings.HasSuffix(p, "IPv6") {
				continue
			}
			if got := state(cloud, "kubernetes", p, e); got != none {
				t.Errorf("%s %s: %s after recovery, want None", p, e, got)
			}
		}
	}
}

// A node replaced under the same name (new VM, new addresses): forgetting
// the old one makes the next call write the new entries.
func TestReplacedNode(t *testing.T) {
	mgr, cloud := setup(t)
	ctx := context.Background()
	if err := mgr.SetAdminStates(ctx, map[*Node]armnetwork.LoadBalancerBackendAddressAdminState{n0: down}); err != nil {
		t.Fatal(err)
	}
	mgr.Forget("n0")
	replacement := &Node{Name: "n0", IPs: []string{"10.0.0.5"}}
	if err := mgr.SetAdminStates(ctx, map[*Node]armnetwork.LoadBalancerBackendAddressAdminState{replacement: down}); err != nil {
		t.Fatal(err)
	}
	if state(cloud, "kubernetes", "kubernetes", "10.0.0.5") != down {
		t.Error("the replacement's entry was not written")
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tt := range []struct{ json, want string }{
		{`{`, "not valid JSON or YAML"},
		{`{"tenantId":"t","resourceGroup":"rg","aadClientId":"a","aadClientSecret":"b"}`, "subscriptionId is required"},
		{`{"tenantId":"t","subscriptionId":"s","resourceGroup":"rg"}`, "no credentials"},
		{`{"tenantId":"t","subscriptionId":"s","resourceGroup":"rg","useManagedIdentityExtension":true,"loadBalancerBackendPoolConfigurationType":"podIP"}`, `"podIP" is not supported`},
		{`{"tenantId":"t","subscriptionId":"s","resourceGroup":"rg","useManagedIdentityExtension":true,"loadBalancerSku":"premium"}`, "not an Azure load balancer SKU"},
	} {
		if _, err := ParseConfig([]byte(tt.json)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.json, err, tt.want)
		}
	}
	// A Basic configuration is valid (the migration reads it); admin
	// state refuses it, naming the way out.
	basic, err := ParseConfig([]byte(`{"tenantId":"t","subscriptionId":"s","resourceGroup":"rg","useManagedIdentityExtension":true,"loadBalancerSku":"basic"}`))
	if err != nil {
		t.Fatalf("a Basic configuration: %v", err)
	}
	if err := basic.ValidateForAdminState(); err == nil || !strings.Contains(err.Error(), "ebb azure migrate-basic-lb") {
		t.Errorf("admin state with a Basic configuration: %v", err)
	}
	cfg, err := ParseConfig([]byte(`{"tenantId":"t","subscriptionId":"s","resourceGroup":"rg","useManagedIdentityExtension":true,"clusterName":"c1"}`))
	if err != nil || cfg.LoadBalancerResourceGroup != "rg" || cfg.LoadBalancerNames()[0] != "c1" || cfg.LoadBalancerBackendPoolConfigurationType != PoolTypeNIC {
		t.Errorf("defaults: %+v %v", cfg, err)
	}
}

// Each load balancer converges on its own: the cluster's second Standard
// load balancer and the default one's internal twin do not exist yet (no
// error: nothing to set there), and a write that fails on one load
// balancer leaves the other done, so the retry reads and writes only the
// failed one.
func TestEachLoadBalancerConvergesOnItsOwn(t *testing.T) {
	cloud := azurefake.New()
	cloud.AddPool("kubernetes", pool("kubernetes", ipEntry("10.0.0.4")))
	cloud.AddPool("blue-internal", pool("kubernetes", ipEntry("10.0.0.4")))
	mgr := newManager(t, cloud, `{"tenantId":"t","subscriptionId":"s","resourceGroup":"rg","useManagedIdentityExtension":true,
		"loadBalancerBackendPoolConfigurationType":"nodeIP","multipleStandardLoadBalancerConfigurations":[{"name":"kubernetes"},{"name":"blue"}]}`)
	ctx := context.Background()
	n := &Node{Name: "n0", IPs: []string{"10.0.0.4"}}
	cloud.FailNext = 1 // the first write: load balancer kubernetes
	err := mgr.SetAdminStates(ctx, map[*Node]State{n: down})
	if err == nil || !strings.Contains(err.Error(), "load balancer kubernetes:") || strings.Contains(err.Error(), "blue") {
		t.Fatalf("error %v, want one naming only load balancer kubernetes", err)
	}
	if state(cloud, "blue-internal", "kubernetes", "10.0.0.4") != down {
		t.Error("the internal load balancer was not written (or held back by the other's failure)")
	}
	lists, puts := cloud.Count("list"), cloud.Count("put")
	if err := mgr.SetAdminStates(ctx, map[*Node]State{n: down}); err != nil {
		t.Fatal(err)
	}
	if state(cloud, "kubernetes", "kubernetes", "10.0.0.4") != down {
		t.Error("the retry did not write the failed load balancer")
	}
	if l, p := cloud.Count("list")-lists, cloud.Count("put")-puts; l != 1 || p != 1 {
		t.Errorf("the retry listed %d load balancers and wrote %d pools, want 1 and 1 (only the failed one)", l, p)
	}
}

// A write names the etag it read in If-Match: when another writer
// (cloud-provider-azure adding a node) changes the pool in between, the
// write is refused and redone on a fresh read, so neither change is lost.
func TestWriteIsConditionalOnTheEtagItRead(t *testing.T) {
	mgr, cloud := setup(t)
	cloud.OtherWriterNext = func(_, _ string, p *armnetwork.BackendAddressPool) {
		p.Properties.LoadBalancerBackendAddresses = append(p.Properties.LoadBalancerBackendAddresses, ipEntry("10.0.0.7"))
	}
	if err := mgr.SetAdminStates(context.Background(), map[*Node]State{n0: down}); err != nil {
		t.Fatal(err)
	}
	p := cloud.Pool("kubernetes", "kubernetes")
	if !slices.ContainsFunc(p.Properties.LoadBalancerBackendAddresses, func(e *armnetwork.LoadBalancerBackendAddress) bool { return *e.Name == "10.0.0.7" }) {
		t.Error("the other writer's address was lost: the write overwrote it")
	}
	if state(cloud, "kubernetes", "kubernetes", "10.0.0.4") != down {
		t.Error("ebb's change was lost")
	}
}

// Every Azure call is observed in cloud-provider-azure's series, with its
// labels.
func TestCallsAreObservedWithCloudProviderAzureLabels(t *testing.T) {
	mgr, _ := setup(t)
	if err := mgr.SetAdminStates(context.Background(), map[*Node]State{n0: down}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"request": "loadbalancer_adminstate_update_backend_pool", "resource_group": "rg", "subscription_id": "s", "source": "ebb-adminstate", "result_code": "200"}
	ch := make(chan prometheus.Metric, 100)
	mgr.m.requestLatency.Collect(ch)
	close(ch)
	found := false
	for metric := range ch {
		var d dto.Metric
		if err := metric.Write(&d); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, l := range d.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if maps.Equal(got, want) && d.GetHistogram().GetSampleCount() > 0 {
			found = true
		}
	}
	if !found {
		t.Errorf("no update observed with labels %v", want)
	}
}

// Availability-set and VMSS Flex VMs are VM resources of their own: their
// NIC's name says nothing about the node, so the NIC is found through the
// VM (once, then cached).
func TestStandaloneVMsAreMatchedThroughTheirNICs(t *testing.T) {
	cloud := azurefake.New()
	nic := "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/aks-nodepool1-12345-nic-0"
	id := nic + "/ipConfigurations/ipconfig1"
	cloud.AddPool("kubernetes", pool("kubernetes", &armnetwork.LoadBalancerBackendAddress{Name: ptr("as-0"), Properties: &armnetwork.LoadBalancerBackendAddressPropertiesFormat{
		NetworkInterfaceIPConfiguration: &armnetwork.SubResource{ID: &id}}}))
	cloud.AddVM("aks-nodepool1-12345-0", nic)
	mgr := newManager(t, cloud, `{"tenantId":"t","subscriptionId":"s","resourceGroup":"rg","useManagedIdentityExtension":true}`)
	n := &Node{Name: "node-a", IPs: []string{"10.0.0.4"}, ProviderID: "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/aks-nodepool1-12345-0"}
	ctx := context.Background()
	if err := mgr.SetAdminStates(ctx, map[*Node]State{n: down}); err != nil {
		t.Fatal(err)
	}
	if state(cloud, "kubernetes", "kubernetes", "as-0") != down {
		t.Error("the standalone VM's entry was not matched")
	}
	mgr.Invalidate()
	if err := mgr.SetAdminStates(ctx, map[*Node]State{{Name: n.Name, IPs: n.IPs, ProviderID: n.ProviderID}: none}); err != nil {
		t.Fatal(err)
	}
	if state(cloud, "kubernetes", "kubernetes", "as-0") != none || cloud.Count("vm-get") != 1 {
		t.Errorf("state %s after %d VM reads, want None after 1 (cached)", state(cloud, "kubernetes", "kubernetes", "as-0"), cloud.Count("vm-get"))
	}
}

// A node to be set Down that no pool holds is an error naming it, and a
// metric, not a success; the next call looks again.
func TestUnmatchedNodeIsReportedNotSucceeded(t *testing.T) {
	mgr, cloud := setup(t)
	stray := &Node{Name: "stray", IPs: []string{"10.9.9.9"}}
	err := mgr.SetAdminStates(context.Background(), map[*Node]State{stray: down, n0: down})
	var unmatched *UnmatchedError
	if !errors.As(err, &unmatched) || !slices.Equal(unmatched.Nodes, []string{"stray"}) {
		t.Fatalf("error %v, want an UnmatchedError naming only stray", err)
	}
	if got := testutil.ToFloat64(mgr.m.unmatched); got != 1 {
		t.Errorf("unmatched gauge %v, want 1", got)
	}
	lists := cloud.Count("list")
	if err := mgr.SetAdminStates(context.Background(), map[*Node]State{stray: down, n0: down}); !errors.As(err, &unmatched) {
		t.Fatalf("the second call: %v", err)
	}
	if cloud.Count("list") == lists {
		t.Error("the unmatched node was cached as done: the second call did not look again")
	}
	if state(cloud, "kubernetes", "kubernetes", "10.0.0.4") != down {
		t.Error("the matched node was not written")
	}
}
