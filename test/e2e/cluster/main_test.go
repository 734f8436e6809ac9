// Package cluster_test checks that the local cluster behaves like a real
// one where ebb depends on it: node ports, kube-proxy's health checks, the
// Eviction API with PodDisruptionBudgets, and graceful pod termination. Its
// nodes are real (kubelet and containerd, agnhost apps), so what it checks
// is upstream's behaviour on this machine's network, not a stand-in's.
package cluster_test

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/podserver"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

var cluster *localcluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(localcluster.RunTests(m, localcluster.Options{Name: "e2e-cluster", Nodes: 3, RealKubelets: true}, &cluster))
}

// newNamespace creates a namespace for one test and deletes it afterwards.
func newNamespace(t *testing.T, ctx context.Context) string {
	t.Helper()
	return e2eutil.NewNamespace(t, ctx, cluster)
}

// getIdentity asks url which pod answered (e2eutil.Identify).
func getIdentity(ctx context.Context, client *http.Client, url string) (podserver.Identity, error) {
	return e2eutil.Identify(ctx, cluster, client, url)
}

// eventually polls cond until it holds or timeout passes.
func eventually(t *testing.T, ctx context.Context, timeout time.Duration, what string, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	e2eutil.Eventually(t, ctx, timeout, what, cond)
}

// deployEcho creates the echo Deployment and a Service of type typ, both
// named web, and waits for the Deployment.
func deployEcho(t *testing.T, ctx context.Context, ns string, replicas int32, typ corev1.ServiceType) *corev1.Service {
	t.Helper()
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, cluster.AppDeployment(ns, "web", replicas), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := cluster.Client.CoreV1().Services(ns).Create(ctx, localcluster.EchoService(ns, "web", typ), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitDeploymentAvailable(ctx, ns, "web", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	return svc
}
