// Package azure_test drives ebb's Azure admin state end to end: `ebb
// controller --cloud azure` runs on the local cluster against a fake Azure
// Resource Manager (the SDK's fake server over an in-memory model, served
// over HTTPS with a managed-identity token endpoint), and taints on the
// cluster's nodes turn their backend entries Down and back.
package azure_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/internal/provider/azure/azurefake"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

var (
	cluster *localcluster.Cluster
	cloud   *azurefake.Cloud
	// controllerArgs start ebb controller against the fake; stopController
	// stops the running one.
	controllerArgs []string
	stopController func()
)

func TestMain(m *testing.M) {
	os.Exit(localcluster.RunTests(m, localcluster.Options{Name: "e2e-azure", Nodes: 3}, &cluster, startEbb))
}

// startEbb serves the fake Azure and runs ebb controller against it.
func startEbb(c *localcluster.Cluster) (func(), error) {
	bin := os.Getenv("EBB_BIN")
	if bin == "" {
		return nil, errors.New("EBB_BIN is not set: run the end-to-end tests with `make test` (it builds bin/ebb)")
	}
	cloud = azurefake.New()
	var v4 []*armnetwork.LoadBalancerBackendAddress
	for _, n := range c.Nodes {
		ip := n.IP
		v4 = append(v4, &armnetwork.LoadBalancerBackendAddress{Name: &ip, Properties: &armnetwork.LoadBalancerBackendAddressPropertiesFormat{IPAddress: &ip}})
	}
	// The cluster's load balancer and its internal twin, each with
	// cloud-provider-azure's node pool.
	name := "kubernetes"
	for _, lb := range []string{"kubernetes", "kubernetes-internal"} {
		cloud.AddPool(lb, armnetwork.BackendAddressPool{Name: &name, Properties: &armnetwork.BackendAddressPoolPropertiesFormat{LoadBalancerBackendAddresses: v4}})
	}
	srv, ca := cloud.Serve()
	dir := c.Dir()
	caFile, cfgFile := filepath.Join(dir, "azure-ca.pem"), filepath.Join(dir, "azure.json")
	cfg := fmt.Sprintf(`{"cloud":"AzurePublicCloud","tenantId":"t","subscriptionId":"sub","resourceGroup":"rg","useManagedIdentityExtension":true,
		"loadBalancerBackendPoolConfigurationType":"nodeIP","enableLoadBalancerAdminState":true,"resourceManagerEndpoint":%q}`, srv.URL)
	if err := os.WriteFile(caFile, ca, 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	// The controller inherits these: the managed identity answers from
	// the fake, whose certificate it trusts.
	for k, v := range map[string]string{"IDENTITY_ENDPOINT": srv.URL + azurefake.TokenPath, "IDENTITY_HEADER": "e2e", "SSL_CERT_FILE": caFile} {
		if err := os.Setenv(k, v); err != nil {
			return nil, err
		}
	}
	controllerArgs = []string{"--cloud", "azure", "--azure-config", cfgFile}
	stop, err := ebbrun.StartController(c, bin, controllerArgs...)
	if err != nil {
		srv.Close()
		return nil, err
	}
	stopController = stop
	return func() {
		stopController()
		srv.Close()
	}, nil
}

// restartController stops ebb controller and runs it again: a new process
// with nothing in memory.
func restartController(t *testing.T) {
	t.Helper()
	stopController()
	stop, err := ebbrun.StartController(cluster, os.Getenv("EBB_BIN"), controllerArgs...)
	if err != nil {
		t.Fatalf("restarting ebb controller: %v", err)
	}
	stopController = stop
}

// entryState is ip's admin state on the external load balancer;
// entryStateOn on any.
func entryState(ip string) string { return entryStateOn("kubernetes", ip) }

func entryStateOn(lb, ip string) string {
	for _, e := range cloud.Pool(lb, "kubernetes").Properties.LoadBalancerBackendAddresses {
		if *e.Properties.IPAddress == ip && e.Properties.AdminState != nil {
			return string(*e.Properties.AdminState)
		}
	}
	return "None"
}

func setTaint(t *testing.T, ctx context.Context, node, key string, on bool) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var taints []corev1.Taint
		for _, tn := range n.Spec.Taints {
			if tn.Key != key {
				taints = append(taints, tn)
			}
		}
		if on {
			value := "e2e"
			if key == lbmodel.TaintAzureDraining {
				value = lbmodel.SpotEvictionValue // the only value that means leaving
			}
			taints = append(taints, corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffectNoSchedule})
		}
		n.Spec.Taints = taints
		_, err = cluster.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Leaving taints on nodes turn their Azure backend entries Down; removing
// them restores None; nodes in rotation are never written.
func TestTaintsSetAzureAdminState(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(cluster.Dir(), "logs", "ebb-controller.log"))
			lines := strings.Split(string(log), "\n")
			t.Logf("ebb controller's log, last lines:\n%s", strings.Join(lines[max(0, len(lines)-30):], "\n"))
		}
	})
	a, b, c := cluster.Nodes[0], cluster.Nodes[1], cluster.Nodes[2]
	puts := cloud.Count("put")
	setTaint(t, ctx, a.Name, lbmodel.TaintOutOfService, true)
	setTaint(t, ctx, b.Name, lbmodel.TaintAzureDraining, true)
	both := func(ip string) string {
		return entryStateOn("kubernetes", ip) + "/" + entryStateOn("kubernetes-internal", ip)
	}
	e2eutil.Eventually(t, ctx, 20*time.Second, "both tainted nodes Down on the external and internal load balancers", func(context.Context) (bool, string) {
		return both(a.IP) == "Down/Down" && both(b.IP) == "Down/Down", fmt.Sprintf("%s %s", both(a.IP), both(b.IP))
	})
	if both(c.IP) != "None/None" {
		t.Errorf("the untainted node is %s", both(c.IP))
	}
	setTaint(t, ctx, a.Name, lbmodel.TaintOutOfService, false)
	setTaint(t, ctx, b.Name, lbmodel.TaintAzureDraining, false)
	e2eutil.Eventually(t, ctx, 20*time.Second, "both back to None on both load balancers", func(context.Context) (bool, string) {
		return both(a.IP) == "None/None" && both(b.IP) == "None/None", fmt.Sprintf("%s %s", both(a.IP), both(b.IP))
	})
	page := e2eutil.Scrape(t, ebbrun.ControllerMetricsAddress)
	if !strings.Contains(page, "loadbalancer_adminstate_operation_duration_seconds_count") {
		t.Error("no loadbalancer_adminstate metrics on the controller")
	}
	if !strings.Contains(page, `cloudprovider_azure_api_request_duration_seconds_count{request="loadbalancer_adminstate_update_backend_pool",resource_group="rg",result_code="200",source="ebb-adminstate",subscription_id="sub"}`) {
		t.Error("no cloudprovider_azure_api_request_duration_seconds series for the pool updates")
	}
	// Two transitions of two nodes on two load balancers: one write per
	// pool per transition when both nodes go together, two when apart.
	if puts := cloud.Count("put") - puts; puts < 4 || puts > 8 {
		t.Errorf("%d writes for two transitions of two nodes on two load balancers, want 4 to 8", puts)
	}
}

// A node left Down when ebb controller stopped, and untainted while it was
// gone, is set back to None by the next run: restart-safety both ways.
func TestRestartConvergesEntriesLeftDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := cluster.Nodes[0]
	setTaint(t, ctx, a.Name, lbmodel.TaintDraining, true)
	e2eutil.Eventually(t, ctx, 20*time.Second, "the tainted node Down", func(context.Context) (bool, string) {
		return entryState(a.IP) == "Down" && entryStateOn("kubernetes-internal", a.IP) == "Down", entryState(a.IP)
	})
	stopController()
	setTaint(t, ctx, a.Name, lbmodel.TaintDraining, false)
	start := time.Now()
	restartController(t)
	e2eutil.Eventually(t, ctx, 30*time.Second, "the untainted node back to None after the restart", func(context.Context) (bool, string) {
		return entryState(a.IP) == "None" && entryStateOn("kubernetes-internal", a.IP) == "None", entryState(a.IP)
	})
	t.Logf("None %s after the restart began (process start included)", time.Since(start).Round(time.Millisecond))
}

// Another writer that keeps rewriting the pool from a stale copy (as
// cloud-provider-azure's EnsureHostsInPool may, from its cache) cannot keep
// a draining node None for longer than ebb's drift check: the longest
// stretch of None is measured and bounded.
func TestCompetingWriterCannotKeepADrainingNodeNone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := cluster.Nodes[1]
	setTaint(t, ctx, b.Name, lbmodel.TaintDraining, true)
	defer setTaint(t, context.Background(), b.Name, lbmodel.TaintDraining, false)
	e2eutil.Eventually(t, ctx, 20*time.Second, "the draining node Down", func(context.Context) (bool, string) {
		return entryState(b.IP) == "Down", entryState(b.IP)
	})
	stale := func(p *armnetwork.BackendAddressPool) {
		for _, e := range p.Properties.LoadBalancerBackendAddresses {
			e.Properties.AdminState = nil
		}
	}
	const window, every = 20 * time.Second, 3 * time.Second
	var longest, noneSince time.Duration
	var rewrites int
	start := time.Now()
	nextRewrite := time.Duration(0)
	for elapsed := time.Duration(0); elapsed < window; elapsed = time.Since(start) {
		if elapsed >= nextRewrite {
			cloud.Rewrite("kubernetes", "kubernetes", stale)
			rewrites++
			nextRewrite += every
		}
		if entryState(b.IP) == "None" {
			if noneSince == 0 {
				noneSince = max(elapsed, time.Nanosecond)
			}
			longest = max(longest, elapsed-noneSince)
		} else {
			noneSince = 0
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d stale rewrites in %s: the draining node was None for at most %s at a time", rewrites, window, longest.Round(10*time.Millisecond))
	// The drift check runs every 5 s while a node is Down; a rewrite just
	// after one waits at most that, plus one list and one write.
	if longest > 7*time.Second {
		t.Errorf("a competing writer kept the draining node None for %s, want at most 7 s", longest)
	}
	e2eutil.Eventually(t, ctx, 10*time.Second, "Down again after the writer stops", func(context.Context) (bool, string) {
		return entryState(b.IP) == "Down", entryState(b.IP)
	})
}
