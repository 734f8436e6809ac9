// Package service_test drives Services of type LoadBalancer end to end, as
// a user would: ebb installed from dist/install.yaml on the local cluster
// (its pods running ebb's image), kubectl-equivalent API calls, and traffic
// through the load balancer's addresses.
package service_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

var (
	cluster *localcluster.Cluster
	// lbNode runs ebb: the ebb lb DaemonSet's pod and both controller
	// replicas (an infrastructure node). The tests drain, taint and
	// replace the other nodes, which carry the apps, without moving ebb.
	lbNode localcluster.Node
)

func TestMain(m *testing.M) {
	dist := e2eutil.DistDir()
	opts := localcluster.Options{Name: "e2e-service", Nodes: 4, RealKubelets: true, Images: []string{filepath.Join(dist, "oci")}}
	os.Exit(localcluster.RunTests(m, opts, &cluster, func(c *localcluster.Cluster) (func(), error) { return setUp(c, dist) }))
}

// setUp installs ebb with ebb lb and the controllers on the last node,
// the VIP pools routed to it.
func setUp(c *localcluster.Cluster, dist string) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	lbNode = c.Nodes[len(c.Nodes)-1]
	if err := ebbrun.InstallOnNode(ctx, c, filepath.Join(dist, "install.yaml"), lbNode); err != nil {
		return nil, err
	}
	return func() {}, nil
}

// appNodes are the nodes that carry the apps (all but the LB node).
func appNodes() []localcluster.Node { return cluster.Nodes[:len(cluster.Nodes)-1] }

// newNamespace creates a namespace for one test and deletes it afterwards.
func newNamespace(t *testing.T, ctx context.Context) string {
	t.Helper()
	return e2eutil.NewNamespace(t, ctx, cluster)
}

// eventually polls cond until it holds or timeout passes.
func eventually(t *testing.T, ctx context.Context, timeout time.Duration, what string, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	e2eutil.Eventually(t, ctx, timeout, what, cond)
}

// lbService is EchoService as a LoadBalancer of the given class (nil: none).
func lbService(ns, name string, class *string) *corev1.Service {
	svc := localcluster.EchoService(ns, name, corev1.ServiceTypeLoadBalancer)
	svc.Spec.LoadBalancerClass = class
	return svc
}

var ebbClass = ptr.To(lbmodel.ClassL4)

// deployApp creates the app's Deployment (agnhost netexec on real nodes:
// HTTP on 8080, UDP on 8081) and waits for its pods.
func deployApp(t *testing.T, ctx context.Context, ns, name string, replicas int32) {
	t.Helper()
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, cluster.AppDeployment(ns, name, replicas), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitDeploymentAvailable(ctx, ns, name, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// deploySpreadApp is deployApp with at most one pod more on any node than
// on another (a hard topology spread over the nodes that take pods), so
// that a test that drains one node knows others hold pods too: with
// externalTrafficPolicy Local only they can serve. The scheduler's default
// spreading is a preference, and it put every pod on one node when the
// others were busy removing the pods of earlier tests.
func deploySpreadApp(t *testing.T, ctx context.Context, ns, name string, replicas int32) {
	t.Helper()
	d := cluster.AppDeployment(ns, name, replicas)
	d.Spec.Template.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
		MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule,
		LabelSelector:    &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
		NodeTaintsPolicy: ptr.To(corev1.NodeInclusionPolicyHonor),
	}}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitDeploymentAvailable(ctx, ns, name, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// exposeApp deploys the app with replicas behind a LoadBalancer
// Service of ebb's class, both named name, and returns the Service's
// address once it has one.
func exposeApp(t *testing.T, ctx context.Context, ns, name string, replicas int32) string {
	t.Helper()
	deployApp(t, ctx, ns, name, replicas)
	if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, lbService(ns, name, ebbClass), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return waitAddress(t, ctx, ns, name)
}

// waitAddress waits for the Service's load-balancer address.
func waitAddress(t *testing.T, ctx context.Context, ns, name string) string {
	t.Helper()
	var ip string
	eventually(t, ctx, 30*time.Second, "a load-balancer address for "+name, func(ctx context.Context) (bool, string) {
		svc, err := cluster.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if len(svc.Status.LoadBalancer.Ingress) == 0 {
			return false, fmt.Sprintf("no ingress in status; conditions %+v", svc.Status.Conditions)
		}
		ip = svc.Status.LoadBalancer.Ingress[0].IP
		return true, ""
	})
	return ip
}

// waitServes waits until url answers through the load balancer on every
// path: as many requests in a row as two rounds over the nodes succeed. A
// Service's endpoints are in the API before every node's kube-proxy has
// programmed them, as in any cluster.
func waitServes(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	eventually(t, ctx, 30*time.Second, "every path to "+url+" answering", func(ctx context.Context) (bool, string) {
		for i := range 2 * len(appNodes()) {
			if _, err := get(ctx, url); err != nil {
				return false, fmt.Sprintf("request %d: %v", i, err)
			}
		}
		return true, ""
	})
}

var httpClient = &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// get sends one request on a new connection and returns the name of the
// pod that answered.
func get(ctx context.Context, url string) (string, error) {
	return getVia(ctx, httpClient, url)
}

// getVia is get through client.
func getVia(ctx context.Context, client *http.Client, url string) (string, error) {
	return e2eutil.AnsweringPod(ctx, cluster, client, url)
}

// podNodes maps each of an app's pods to its node.
func podNodes(t *testing.T, ctx context.Context, ns, app string) map[string]string {
	t.Helper()
	pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		out[p.Name] = p.Spec.NodeName
	}
	return out
}

// podNames lists the names of an app's pods.
func podNames(t *testing.T, ctx context.Context, ns, app string) map[string]bool {
	t.Helper()
	pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Name] = true
		}
	}
	return out
}
