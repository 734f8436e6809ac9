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

	clustercmd "github.com/ebbdev/ebb/internal/cmd/cluster"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/provider/azure/azurefake"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

var (
	cluster *localcluster.Cluster
	cloud   *azurefake.Cloud
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
	name := "kubernetes"
	cloud.AddPool("kubernetes", armnetwork.BackendAddressPool{Name: &name, Properties: &armnetwork.BackendAddressPoolPropertiesFormat{LoadBalancerBackendAddresses: v4}})
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
	stop, err := clustercmd.StartController(c, bin, "--cloud", "azure", "--azure-config", cfgFile)
	if err != nil {
		srv.Close()
		return nil, err
	}
	return func() {
		stop()
		srv.Close()
	}, nil
}

func entryState(ip string) string {
	for _, e := range cloud.Pool("kubernetes", "kubernetes").Properties.LoadBalancerBackendAddresses {
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
			taints = append(taints, corev1.Taint{Key: key, Value: "e2e", Effect: corev1.TaintEffectNoSchedule})
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
	setTaint(t, ctx, a.Name, lbmodel.TaintOutOfService, true)
	setTaint(t, ctx, b.Name, lbmodel.TaintAzureDraining, true)
	e2eutil.Eventually(t, ctx, 20*time.Second, "both tainted nodes Down on Azure", func(context.Context) (bool, string) {
		return entryState(a.IP) == "Down" && entryState(b.IP) == "Down", fmt.Sprintf("%s %s", entryState(a.IP), entryState(b.IP))
	})
	if entryState(c.IP) != "None" {
		t.Errorf("the untainted node is %s", entryState(c.IP))
	}
	setTaint(t, ctx, a.Name, lbmodel.TaintOutOfService, false)
	setTaint(t, ctx, b.Name, lbmodel.TaintAzureDraining, false)
	e2eutil.Eventually(t, ctx, 20*time.Second, "both back to None", func(context.Context) (bool, string) {
		return entryState(a.IP) == "None" && entryState(b.IP) == "None", fmt.Sprintf("%s %s", entryState(a.IP), entryState(b.IP))
	})
	page := e2eutil.Scrape(t, clustercmd.ControllerMetricsAddress)
	if !strings.Contains(page, "loadbalancer_adminstate_operation_duration_seconds_count") {
		t.Error("no loadbalancer_adminstate metrics on the controller")
	}
	if puts := cloud.Count("put"); puts < 2 || puts > 4 {
		t.Errorf("%d writes for two transitions of two nodes, want 2 to 4", puts)
	}
}
