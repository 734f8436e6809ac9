package helm_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// releasedChart is the chart make release packaged: the one dist/ebb-*.tgz.
func releasedChart(t *testing.T) string {
	t.Helper()
	charts, err := filepath.Glob(filepath.Join(e2eutil.DistDir(), "ebb-*.tgz"))
	if err != nil || len(charts) != 1 {
		t.Fatalf("want one chart in %s (make release packages it), found %v (%v)", e2eutil.DistDir(), charts, err)
	}
	return charts[0]
}

// helm runs helm (built by hack/helm.sh) on the cluster, failing t with
// its output when it fails.
func helm(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	out, err := runHelm(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// runHelm runs helm on the cluster and returns its output.
func runHelm(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "../../../hack/helm.sh").Output()
	if err != nil {
		return "", fmt.Errorf("building helm (hack/helm.sh): %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	cmd := exec.CommandContext(ctx, lines[len(lines)-1], append([]string{"--kubeconfig", cluster.Kubeconfig}, args...)...)
	home := filepath.Join(cluster.Dir(), "helm")
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	combined, err := cmd.CombinedOutput()
	if err != nil {
		return string(combined), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, combined)
	}
	return string(combined), nil
}

// A user installs ebb with helm (with the ServiceMonitor, the alert rules
// and the scraper's role, against the Prometheus operator's CRDs), scrapes
// every component as Prometheus would, serves a Service through it, upgrades the
// release under traffic (every ebb pod replaced) without a failed request
// or a broken connection, and uninstalls it: nothing of ebb's is left but
// the CRDs and their objects, and the Service it served is released (no
// address in its status, no finalizer that would hold its deletion).
func TestHelmInstallUpgradeUninstall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	chart := releasedChart(t)
	if err := ebbrun.SetLBNode(ctx, cluster, lbNode, true); err != nil {
		t.Fatal(err)
	}

	installMonitoringCRDs(t, ctx)
	// The packaged chart lints and renders, as a user's CI would check it.
	helm(t, ctx, "lint", "--strict", chart)
	helm(t, ctx, "template", "ebb", chart, "--namespace", ebbrun.Namespace)

	started := time.Now()
	helm(t, ctx, "install", "ebb", chart, "--namespace", ebbrun.Namespace, "--create-namespace", "--wait", "--timeout", "5m", "--set", monitoringValues)
	if err := ebbrun.WaitInstalled(ctx, cluster, 1); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm install to ready (controller replicas Ready, the webhook's CA injected, ebb lb Ready): %s", time.Since(started).Round(100*time.Millisecond))

	checkScrapes(t, ctx)

	if err := ebbrun.ApplyYAML(ctx, cluster, "addresspool", fmt.Sprintf("apiVersion: lb.ebb.dev/v1alpha1\nkind: AddressPool\nmetadata:\n  name: default\nspec:\n  addresses: [%s]\n", localcluster.VIPCIDR)); err != nil {
		t.Fatal(err)
	}
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vip := e2eutil.DeployLoadBalancedEcho(t, ctx, cluster, ns, "web", 2)
	lb, ok := cluster.Node(lbNode)
	if !ok {
		t.Fatalf("no node %s", lbNode)
	}
	if err := cluster.RouteVIPsVia(netip.MustParseAddr(lb.IP)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.RouteVIPs() })
	url := fmt.Sprintf("http://%s/", net.JoinHostPort(vip.String(), "80"))
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cluster.ExternalClient.DialContext}}
	e2eutil.Eventually(t, ctx, 30*time.Second, "the client reaching "+url, func(ctx context.Context) (bool, string) {
		err := e2eutil.Answered(ctx, cluster, client, url)
		return err == nil, fmt.Sprint(err)
	})

	upgradeUnderTraffic(t, ctx, chart, client, url, netip.AddrPortFrom(vip, 80))
	// After the traffic and the upgrade (connections, hand-offs): every
	// dashboard query and alert rule on what Prometheus scrapes.
	evaluateQueries(t, ctx)
	uninstall(t, ctx, ns, "web")
}

// upgradeUnderTraffic runs helm upgrade with values that change every
// ebb pod template while requests and long-lived connections go through
// the Service, and fails t on any failed request or broken connection.
func upgradeUnderTraffic(t *testing.T, ctx context.Context, chart string, client *http.Client, url string, at netip.AddrPort) {
	t.Helper()
	oldLB, err := ebbrun.LBPods(ctx, cluster)
	if err != nil {
		t.Fatal(err)
	}
	requests := e2eutil.StartRequests(t, ctx, client, url, 2)
	long := e2eutil.StartLongLived(t, ctx, cluster, at, 4)
	time.Sleep(time.Second)

	// helm upgrade --wait returns once the old ebb lb pod is gone, which
	// serves its established connections until they end or for up to
	// --shutdown-timeout (50 s): the long-lived connections end before.
	started := time.Now()
	upgraded := make(chan error, 1)
	go func() {
		_, err := runHelm(ctx, "upgrade", "ebb", chart, "--namespace", ebbrun.Namespace, "--reuse-values", "--wait", "--timeout", "5m",
			"--set", "controller.podAnnotations.upgraded=yes,lb.podAnnotations.upgraded=yes,nodeAgent.podAnnotations.upgraded=yes")
		upgraded <- err
	}()
	if err := ebbrun.WaitLBReplaced(ctx, cluster, oldLB); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm upgrade: the new ebb lb took over %s after it started", time.Since(started).Round(100*time.Millisecond))
	time.Sleep(2 * time.Second)
	long.Halt()
	if err := <-upgraded; err != nil {
		t.Fatal(err)
	}
	if err := ebbrun.WaitInstalled(ctx, cluster, 1); err != nil {
		t.Fatal(err)
	}
	if err := ebbrun.WaitLBPodsGone(ctx, cluster, oldLB); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm upgrade --wait: done, every ebb pod replaced, %s after it started", time.Since(started).Round(100*time.Millisecond))
	time.Sleep(time.Second)
	requests.Halt()

	t.Logf("%d requests on new connections, %d on 4 long-lived connections during the upgrade", requests.OK.Load(), long.OK.Load())
	if n := requests.Failed.Load(); n > 0 {
		t.Errorf("%d of %d requests on new connections failed during helm upgrade; first: %v", n, n+requests.OK.Load(), requests.FirstErr.Load())
	}
	if n := long.Failed.Load(); n > 0 {
		t.Errorf("%d of 4 long-lived connections broke during helm upgrade; first: %v", n, long.FirstErr.Load())
	}
	if requests.OK.Load() == 0 || long.OK.Load() == 0 {
		t.Error("no traffic went through during the upgrade")
	}
	if status := helm(t, ctx, "status", "ebb", "--namespace", ebbrun.Namespace); !strings.Contains(status, "REVISION: 2") || !strings.Contains(status, "STATUS: deployed") {
		t.Errorf("helm status after the upgrade:\n%s", status)
	}
}

// uninstall runs helm uninstall and checks what is left: no ebb pod,
// webhook configuration, admission policy or cluster role; the CRDs and
// the AddressPool (crds.keep); and the Service svcName of ns released and
// deletable.
func uninstall(t *testing.T, ctx context.Context, ns, svcName string) {
	t.Helper()
	started := time.Now()
	helm(t, ctx, "uninstall", "ebb", "--namespace", ebbrun.Namespace, "--wait", "--timeout", "3m")
	t.Logf("helm uninstall: %s", time.Since(started).Round(100*time.Millisecond))

	e2eutil.Eventually(t, ctx, 2*time.Minute, "no pod left in "+ebbrun.Namespace, func(ctx context.Context) (bool, string) {
		pods, err := cluster.Client.CoreV1().Pods(ebbrun.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var names []string
		for _, p := range pods.Items {
			names = append(names, p.Name)
		}
		return len(names) == 0, fmt.Sprint(names)
	})
	var left []string
	if list, err := cluster.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{}); err == nil {
		for _, o := range list.Items {
			left = append(left, "ValidatingWebhookConfiguration/"+o.Name)
		}
	}
	if list, err := cluster.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{}); err == nil {
		for _, o := range list.Items {
			left = append(left, "MutatingWebhookConfiguration/"+o.Name)
		}
	}
	if list, err := cluster.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{}); err == nil {
		for _, o := range list.Items {
			left = append(left, "ValidatingAdmissionPolicy/"+o.Name)
		}
	}
	if list, err := cluster.Client.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{}); err == nil {
		for _, o := range list.Items {
			if strings.HasPrefix(o.Name, "ebb-") {
				left = append(left, "ClusterRole/"+o.Name)
			}
		}
	}
	if len(left) > 0 {
		t.Errorf("left after helm uninstall: %v", left)
	}
	ext, err := apiextensions.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	crds, err := ext.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, c := range crds.Items {
		if strings.HasSuffix(c.Name, ".ebb.dev") {
			kept = append(kept, c.Name)
		}
	}
	if len(kept) != 6 {
		t.Errorf("ebb's CRDs after helm uninstall: %v, want all 6 kept (crds.keep)", kept)
	}

	var pools lbv1alpha1.AddressPoolList
	if err := e2eutil.APIClient(t, cluster).List(ctx, &pools); err != nil || len(pools.Items) != 1 {
		t.Errorf("AddressPools after helm uninstall: %d (%v), want the one created kept", len(pools.Items), err)
	}

	// The Service ebb served is released: no address a client could take
	// for served, and nothing holding its deletion.
	e2eutil.Eventually(t, ctx, time.Minute, "Service "+svcName+" released", func(ctx context.Context) (bool, string) {
		svc, err := cluster.Client.CoreV1().Services(ns).Get(ctx, svcName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		held := slices.Contains(svc.Finalizers, lbmodel.CleanupFinalizer)
		return !held && len(svc.Status.LoadBalancer.Ingress) == 0, fmt.Sprintf("finalizers %v, ingress %v, annotations %v", svc.Finalizers, svc.Status.LoadBalancer.Ingress, svc.Annotations)
	})
	if err := cluster.Client.CoreV1().Services(ns).Delete(ctx, svcName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2eutil.Eventually(t, ctx, 30*time.Second, "Service "+svcName+" deleted", func(ctx context.Context) (bool, string) {
		_, err := cluster.Client.CoreV1().Services(ns).Get(ctx, svcName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}
