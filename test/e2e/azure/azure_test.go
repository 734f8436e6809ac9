// Package azure_test drives ebb's Azure admin state end to end: ebb is
// installed from dist/install.yaml with the controller patched as an Azure
// user patches it (--cloud azure, azure.json read from cloud-provider-azure's
// Secret in kube-system, a CA from a Secret, a managed identity's endpoint
// in its environment), its pods running ebb's
// image against a fake Azure Resource Manager (the SDK's fake server over an
// in-memory model, served over HTTPS on the control-plane host with a
// managed-identity token endpoint), and taints on the cluster's nodes turn
// their backend entries Down and back.
package azure_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
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
)

func TestMain(m *testing.M) {
	dist := e2eutil.DistDir()
	// Real kubelets (issue 40): the controller runs as a user's does,
	// its Secret mounted by the kubelet.
	opts := localcluster.Options{Name: "e2e-azure", Nodes: 3, RealKubelets: true, Images: []string{filepath.Join(dist, "oci")}}
	os.Exit(localcluster.RunTests(m, opts, &cluster, func(c *localcluster.Cluster) (func(), error) { return setUp(c, dist) }))
}

// azureSecret holds the fake's CA; azureDir is where the controller mounts
// it. azure.json is in cloud-provider-azure's Secret, read through the API
// (--azure-config-secret), where ebb lb cannot read it.
const (
	azureSecret          = "ebb-azure"
	azureDir             = "/etc/ebb/azure"
	azureConfigNamespace = "kube-system"
	azureConfigSecret    = "azure-cloud-provider"
)

// setUp serves the fake Azure on the control-plane host, puts its
// configuration in a Secret and installs ebb with the controller patched
// to use it.
func setUp(c *localcluster.Cluster, dist string) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
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
	// On the control-plane host's node-network address: the controller's
	// pods reach it through their nodes, as they would reach Azure.
	srv, ca, err := cloud.Serve(localcluster.ControlPlaneIP)
	if err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`{"cloud":"AzurePublicCloud","tenantId":"t","subscriptionId":"sub","resourceGroup":"rg","useManagedIdentityExtension":true,
		"loadBalancerBackendPoolConfigurationType":"nodeIP","enableLoadBalancerAdminState":true,"resourceManagerEndpoint":%q}`, srv.URL)
	// azure.json where cloud-provider-azure keeps it, out of ebb lb's
	// reach; the fake's CA (no secret) mounted from ebb-system.
	secrets := fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: %s\nstringData:\n  ca.pem: %q\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: %s\nstringData:\n  cloud-config: %q\n",
		ebbrun.Namespace, azureSecret, ebbrun.Namespace, ca, azureConfigSecret, azureConfigNamespace, cfg)
	if err := ebbrun.ApplyYAML(ctx, c, "azure-secrets", secrets); err != nil {
		srv.Close()
		return nil, err
	}
	// The controller's permission to read it, as the component
	// config/components/azure-config-secret grants it.
	rbac, err := os.ReadFile(filepath.Join(dist, "..", "config", "components", "azure-config-secret", "rbac.yaml"))
	if err != nil {
		srv.Close()
		return nil, err
	}
	if err := ebbrun.ApplyYAML(ctx, c, "azure-config-rbac", string(rbac)); err != nil {
		srv.Close()
		return nil, err
	}
	err = ebbrun.InstallManifest(ctx, c, filepath.Join(dist, "install.yaml"), ebbrun.ManifestOptions{
		ControllerArgs: []string{"--cloud=azure", "--azure-config-secret=" + azureConfigNamespace + "/" + azureConfigSecret},
		EditController: func(d *appsv1.Deployment) { useAzure(d, srv.URL) },
	})
	if err != nil {
		srv.Close()
		return nil, err
	}
	return srv.Close, nil
}

// useAzure is the patch of the controller's Deployment: the Secret
// mounted, the managed identity's endpoint (the fake's) in the
// environment, the fake's CA trusted.
func useAzure(d *appsv1.Deployment, url string) {
	spec := &d.Spec.Template.Spec
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "azure", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: azureSecret}}})
	c := &spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "azure", MountPath: azureDir, ReadOnly: true})
	c.Env = append(c.Env,
		corev1.EnvVar{Name: "IDENTITY_ENDPOINT", Value: url + azurefake.TokenPath},
		corev1.EnvVar{Name: "IDENTITY_HEADER", Value: "e2e"},
		corev1.EnvVar{Name: "SSL_CERT_FILE", Value: azureDir + "/ca.pem"})
}

// scaleController scales the controller's Deployment, as kubectl scale
// does (ebbrun.ScaleController).
func scaleController(t *testing.T, ctx context.Context, replicas int32) {
	t.Helper()
	if err := ebbrun.ScaleController(ctx, cluster, replicas); err != nil {
		t.Fatal(err)
	}
}

// logControllersOnFailure logs the last lines of each controller pod's log
// if the test failed.
func logControllersOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		t.Log(e2eutil.ComponentLogs(ctx, cluster, "app.kubernetes.io/name=ebb-controller", 30))
	})
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
	logControllersOnFailure(t)
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
	page := e2eutil.ControllerMetrics(t, ctx, cluster)
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
	// Every replica stops (kubectl scale --replicas=0), the taint goes
	// while none runs, then they come back: new processes with nothing in
	// memory.
	scaleController(t, ctx, 0)
	setTaint(t, ctx, a.Name, lbmodel.TaintDraining, false)
	start := time.Now()
	scaleController(t, ctx, 2)
	e2eutil.Eventually(t, ctx, 30*time.Second, "the untainted node back to None after the restart", func(context.Context) (bool, string) {
		return entryState(a.IP) == "None" && entryStateOn("kubernetes-internal", a.IP) == "None", entryState(a.IP)
	})
	t.Logf("None %s after the restart began (process start included)", time.Since(start).Round(time.Millisecond))
}

// Another writer that keeps rewriting the pool from a stale copy (as
// cloud-provider-azure's EnsureHostsInPool may, from its cache) cannot keep
// a draining node None: ebb's drift check sets it Down again while the
// writer goes on (several times in the window), and it ends Down. The
// longest stretch of None is logged, not bounded: a wall-clock bound on a
// shared 2-core machine failed CI by chance (7.96 s against 7 s, with the
// drift check every 5 s), which says nothing about ebb.
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
	var rewrites, undone int
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
			if noneSince != 0 {
				undone++
			}
			noneSince = 0
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d stale rewrites in %s: ebb set the draining node Down again %d times while the writer went on; it was None for at most %s at a time", rewrites, window, undone, longest.Round(10*time.Millisecond))
	// The drift check runs every 5 s while a node is Down: in 20 s of
	// rewrites every 3 s it undoes the writer about 4 times (4 seen); a
	// check that never ran, or ran only once, would leave the node None
	// for most of the window.
	if undone < 2 {
		t.Errorf("while a competing writer rewrote the pool every %s for %s, ebb set the draining node Down again %d times, want at least 2 (longest None %s)", every, window, undone, longest.Round(10*time.Millisecond))
	}
	e2eutil.Eventually(t, ctx, 10*time.Second, "Down again after the writer stops", func(context.Context) (bool, string) {
		return entryState(b.IP) == "Down", entryState(b.IP)
	})
}

// The Azure configuration, which may hold a client secret, is where ebb
// lb's service account cannot read it (issue 42 item 3): the controller may
// get that one Secret, ebb lb may neither get nor list Secrets there. The
// controller read it, as the other tests of this suite show.
func TestOnlyTheControllerReadsTheAzureConfiguration(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct {
		account, verb, name string
		allowed             bool
	}{
		{"ebb-controller", "get", azureConfigSecret, true},
		{"ebb-lb", "get", azureConfigSecret, false},
		{"ebb-lb", "list", "", false},
		{"ebb-node-agent", "get", azureConfigSecret, false},
	} {
		user := "system:serviceaccount:" + ebbrun.Namespace + ":" + c.account
		review, err := cluster.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ebbrun.Namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: azureConfigNamespace, Verb: c.verb, Resource: "secrets", Name: c.name},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed != c.allowed {
			t.Errorf("%s may %s Secret %s/%s: %v, want %v", c.account, c.verb, azureConfigNamespace, c.name, review.Status.Allowed, c.allowed)
		}
	}
}
