package e2eutil

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster"
)

// DeployLoadBalancedEcho deploys the cluster's test app (an echo on
// simulated nodes, agnhost netexec on real ones: Cluster.AppDeployment) of
// the given replicas (with a 2 s preStop sleep) behind
// a LoadBalancer Service of class ebb.dev/l4, both named name, waits for
// the pods and the Service's address, and returns the address.
func DeployLoadBalancedEcho(t *testing.T, ctx context.Context, c *localcluster.Cluster, ns, name string, replicas int32, shape ...func(*appsv1.Deployment)) netip.Addr {
	t.Helper()
	return DeployLoadBalancedEchoService(t, ctx, c, ns, name, replicas, nil, shape...)[0]
}

// DeployLoadBalancedEchoService is DeployLoadBalancedEcho with the Service
// shaped by svcShape (nil: as is) before it is created; it waits for an
// address per IP family of the Service and returns them, in the Service's
// family order.
func DeployLoadBalancedEchoService(t *testing.T, ctx context.Context, c *localcluster.Cluster, ns, name string, replicas int32, svcShape func(*corev1.Service), shape ...func(*appsv1.Deployment)) []netip.Addr {
	t.Helper()
	// A preStop sleep, as an application behind kube-proxy needs: an
	// evicted pod keeps accepting while every node's kube-proxy learns it
	// is going (maintaining an LB host evicts the app's pods there too).
	dep := c.AppDeployment(ns, name, replicas)
	dep.Spec.Template.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 2}}}
	for _, f := range shape {
		f(dep)
	}
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDeploymentAvailable(ctx, ns, name, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	svc := localcluster.EchoService(ns, name, corev1.ServiceTypeLoadBalancer)
	svc.Spec.LoadBalancerClass = ptr.To(lbmodel.ClassL4)
	if svcShape != nil {
		svcShape(svc)
	}
	created, err := c.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	families := max(len(created.Spec.IPFamilies), 1)
	var vips []netip.Addr
	Eventually(t, ctx, 30*time.Second, "an address for Service "+name, func(ctx context.Context) (bool, string) {
		s, err := c.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if len(s.Status.LoadBalancer.Ingress) < families {
			return false, fmt.Sprintf("addresses %v, want %d", s.Status.LoadBalancer.Ingress, families)
		}
		vips = vips[:0]
		for _, in := range s.Status.LoadBalancer.Ingress {
			vip, err := netip.ParseAddr(in.IP)
			if err != nil {
				return false, err.Error()
			}
			vips = append(vips, vip)
		}
		return true, ""
	})
	return vips
}

// DistDir holds `make release`'s output (the image layout dist/oci and
// dist/install.yaml): $EBB_DIST, or the checkout's dist/ seen from a test
// package under test/e2e.
func DistDir() string {
	if d := os.Getenv("EBB_DIST"); d != "" {
		return d
	}
	abs, _ := filepath.Abs(filepath.Join("..", "..", "..", "dist"))
	return abs
}
