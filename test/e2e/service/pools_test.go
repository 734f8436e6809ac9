package service_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/internal/controller/service"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// An AddressPool decides who gets which address: a Service naming a pool
// whose selector takes it gets the pool's addresses, in order, and they
// serve; the pool's status and kubectl's columns count them; the pool
// full, the next Service gets no address and a Warning that says so, and
// gets the address a deleted Service frees; a Service the selector refuses
// is told why; a pool address invalid for the API is refused at creation.
func TestAddressPoolsDecideWhoGetsWhichAddress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := e2eutil.APIClient(t, cluster)
	bad := &lbv1alpha1.AddressPool{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: lbv1alpha1.AddressPoolSpec{Addresses: []string{"10.96.250.9"}}}
	if err := c.Create(ctx, bad); err == nil || !strings.Contains(err.Error(), "each address must be a CIDR") {
		t.Fatalf("a pool with a bare address: %v", err)
	}
	blue := &lbv1alpha1.AddressPool{ObjectMeta: metav1.ObjectMeta{Name: "blue"}, Spec: lbv1alpha1.AddressPoolSpec{
		Addresses: []string{"10.96.250.1-10.96.250.2"}, AutoAssign: ptr.To(false),
		ServiceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}}}
	if err := c.Create(ctx, blue); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), blue) })

	ns := newNamespace(t, ctx)
	deployApp(t, ctx, ns, "web", 2)
	create := func(name string, team string) {
		t.Helper()
		svc := lbService(ns, name, ebbClass)
		svc.Spec.Selector = map[string]string{"app": "web"}
		svc.Annotations = map[string]string{lbv1alpha1.PoolAnnotation: "blue"}
		if team != "" {
			svc.Labels = map[string]string{"team": team}
		}
		if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create("one", "blue")
	if ip := waitAddress(t, ctx, ns, "one"); ip != "10.96.250.1" {
		t.Fatalf("the first Service of pool blue got %s, want 10.96.250.1", ip)
	}
	create("two", "blue")
	if ip := waitAddress(t, ctx, ns, "two"); ip != "10.96.250.2" {
		t.Fatalf("the second Service of pool blue got %s, want 10.96.250.2", ip)
	}
	waitServes(t, ctx, "http://10.96.250.2/")

	eventually(t, ctx, 30*time.Second, "pool blue's status counting both and Exhausted", func(ctx context.Context) (bool, string) {
		p := &lbv1alpha1.AddressPool{}
		if err := c.Get(ctx, client.ObjectKey{Name: "blue"}, p); err != nil {
			return false, err.Error()
		}
		return p.Status.AssignedIPv4 == 2 && p.Status.AvailableIPv4 == 0 && meta.IsStatusConditionTrue(p.Status.Conditions, lbv1alpha1.ExhaustedCondition),
			fmt.Sprintf("%+v", p.Status)
	})
	out, err := exec.CommandContext(ctx, filepath.Join(cluster.BinDir, "kubectl"), "--kubeconfig", cluster.Kubeconfig, "get", "addresspool", "blue").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get addresspool: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME ADDRESSES AUTO IPV4 USED IPV4 FREE IPV6 USED READY AGE" ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), `blue ["10.96.250.1-10.96.250.2"] false 2 0 0 True`) {
		t.Fatalf("kubectl get addresspool blue:\n%s", out)
	}
	t.Logf("kubectl get addresspool blue:\n%s", out)

	create("three", "blue")
	eventually(t, ctx, 30*time.Second, "a Warning that pool blue is full", func(ctx context.Context) (bool, string) {
		evs := serviceEvents(t, ctx, ns, "three", service.ReasonSyncFailed)
		return len(evs) > 0 && strings.Contains(evs[0], "every address of the pools is in use"), fmt.Sprint(evs)
	})
	// The Service's own status says why it has no address, for kubectl
	// wait and any tool that reads conditions.
	kubectlWait(t, ctx, ns, "three", "condition=lb.ebb.dev/AddressAssigned=false")
	if msg := kubectlJSONPath(t, ctx, ns, "three", `{.status.conditions[?(@.type=="lb.ebb.dev/AddressAssigned")].reason}: {.status.conditions[?(@.type=="lb.ebb.dev/AddressAssigned")].message}`); !strings.HasPrefix(msg, "AllocationFailed: ") || !strings.Contains(msg, "every address of the pools is in use") {
		t.Errorf("three's AddressAssigned condition says %q", msg)
	}
	create("outsider", "")
	eventually(t, ctx, 30*time.Second, "a Warning that pool blue refuses the Service", func(ctx context.Context) (bool, string) {
		evs := serviceEvents(t, ctx, ns, "outsider", service.ReasonSyncFailed)
		return len(evs) > 0 && strings.Contains(evs[0], "pool blue takes only Services with labels team=blue"), fmt.Sprint(evs)
	})

	// An address freed goes to the Service waiting for one.
	if err := cluster.Client.CoreV1().Services(ns).Delete(ctx, "one", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if ip := waitAddress(t, ctx, ns, "three"); ip != "10.96.250.1" {
		t.Fatalf("the waiting Service got %s, want the freed 10.96.250.1", ip)
	}
	kubectlWait(t, ctx, ns, "three", "condition=lb.ebb.dev/AddressAssigned")
	kubectlWait(t, ctx, ns, "three", "condition=lb.ebb.dev/Served")
	if msg := kubectlJSONPath(t, ctx, ns, "three", `{.status.conditions[?(@.type=="lb.ebb.dev/AddressAssigned")].message}`); msg != "assigned 10.96.250.1" {
		t.Errorf("three's AddressAssigned condition says %q once it has its address", msg)
	}
	waitServes(t, ctx, "http://10.96.250.1/")
}

// kubectlWait runs kubectl wait --for=for on a Service, as a user's
// script would.
func kubectlWait(t *testing.T, ctx context.Context, ns, name, forWhat string) {
	t.Helper()
	out, err := exec.CommandContext(ctx, filepath.Join(cluster.BinDir, "kubectl"), "--kubeconfig", cluster.Kubeconfig, "-n", ns,
		"wait", "--for="+forWhat, "--timeout=60s", "service/"+name).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl wait --for=%s service/%s: %v\n%s", forWhat, name, err, out)
	}
}

// kubectlJSONPath is kubectl get -o jsonpath=path of a Service.
func kubectlJSONPath(t *testing.T, ctx context.Context, ns, name, path string) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, filepath.Join(cluster.BinDir, "kubectl"), "--kubeconfig", cluster.Kubeconfig, "-n", ns,
		"get", "service", name, "-o", "jsonpath="+path).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get service %s -o jsonpath: %v\n%s", name, err, out)
	}
	return string(out)
}

// spec.ipFamilyPolicy decides what a Service gets from a pool that has one
// family only (issue 50 item 11): PreferDualStack gets the IPv4 address and
// serves, with a Normal event naming the missing IPv6; RequireDualStack gets
// nothing, holds nothing, and a Warning says why. Once the pool has an IPv6
// range too, both get an address of each family.
func TestIPFamilyPolicyDecidesWhatAServiceGets(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := e2eutil.APIClient(t, cluster)
	amber := &lbv1alpha1.AddressPool{ObjectMeta: metav1.ObjectMeta{Name: "amber"}, Spec: lbv1alpha1.AddressPoolSpec{
		Addresses: []string{"10.96.249.1-10.96.249.2"}, AutoAssign: ptr.To(false)}}
	if err := c.Create(ctx, amber); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), amber) })

	ns := newNamespace(t, ctx)
	deployApp(t, ctx, ns, "web", 2)
	create := func(name string, policy corev1.IPFamilyPolicy) {
		t.Helper()
		svc := lbService(ns, name, ebbClass)
		svc.Spec.Selector = map[string]string{"app": "web"}
		svc.Spec.IPFamilyPolicy = &policy
		svc.Annotations = map[string]string{lbv1alpha1.PoolAnnotation: "amber"}
		created, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(created.Spec.IPFamilies) != 2 {
			t.Fatalf("the dual-stack cluster gave %s Service %s the families %v", policy, name, created.Spec.IPFamilies)
		}
	}
	create("prefer", corev1.IPFamilyPolicyPreferDualStack)
	create("require", corev1.IPFamilyPolicyRequireDualStack)
	if ip := waitAddress(t, ctx, ns, "prefer"); ip != "10.96.249.1" {
		t.Fatalf("the PreferDualStack Service got %s, want 10.96.249.1", ip)
	}
	waitServes(t, ctx, "http://10.96.249.1/")
	eventually(t, ctx, 30*time.Second, "a Normal event naming the missing IPv6 address", func(ctx context.Context) (bool, string) {
		evs := serviceEvents(t, ctx, ns, "prefer", service.ReasonAddressFamilyUnavailable)
		return len(evs) > 0 && strings.Contains(evs[0], "no IPv6 address"), fmt.Sprint(evs)
	})
	eventually(t, ctx, 30*time.Second, "a Warning that RequireDualStack needs an IPv6 address", func(ctx context.Context) (bool, string) {
		evs := serviceEvents(t, ctx, ns, "require", service.ReasonSyncFailed)
		return len(evs) > 0 && strings.Contains(evs[0], "RequireDualStack needs an IPv6 address"), fmt.Sprint(evs)
	})
	eventually(t, ctx, 30*time.Second, "pool amber counting only the PreferDualStack Service's address", func(ctx context.Context) (bool, string) {
		p := &lbv1alpha1.AddressPool{}
		if err := c.Get(ctx, client.ObjectKey{Name: "amber"}, p); err != nil {
			return false, err.Error()
		}
		return p.Status.AssignedIPv4 == 1, fmt.Sprintf("%+v", p.Status)
	})
	if svc, err := cluster.Client.CoreV1().Services(ns).Get(ctx, "require", metav1.GetOptions{}); err != nil || len(svc.Status.LoadBalancer.Ingress) != 0 {
		t.Fatalf("the RequireDualStack Service: %v, status %+v, want no address", err, svc.Status.LoadBalancer)
	}

	// An IPv6 range added to the pool: both get one address of each family.
	if err := c.Get(ctx, client.ObjectKey{Name: "amber"}, amber); err != nil {
		t.Fatal(err)
	}
	amber.Spec.Addresses = append(amber.Spec.Addresses, "fd00:96:240::ff00/127")
	if err := c.Update(ctx, amber); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"prefer", "require"} {
		var ipv6 string
		eventually(t, ctx, 30*time.Second, name+" with an IPv4 and an IPv6 address", func(ctx context.Context) (bool, string) {
			svc, err := cluster.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			in := svc.Status.LoadBalancer.Ingress
			if len(in) != 2 || !strings.HasPrefix(in[0].IP, "10.96.249.") || !strings.HasPrefix(in[1].IP, "fd00:96:240::ff0") {
				return false, fmt.Sprintf("%+v", in)
			}
			ipv6 = in[1].IP
			return true, ""
		})
		waitServes(t, ctx, "http://["+ipv6+"]/")
	}
}
