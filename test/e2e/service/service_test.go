package service_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/lbsync"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// A Service of class ebb.dev/l4 gets an address from the pool, with the
// cleanup finalizer and ipMode Proxy, and HTTP through that address reaches
// every pod.
func TestServiceOfOurClassServesTrafficThroughItsAddress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	ip := exposeApp(t, ctx, ns, "web", 3)
	svc, err := cluster.Client.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !localcluster.VIPCIDR.Contains(net.ParseIP(ip)) {
		t.Errorf("address %s is outside the pool %s", ip, localcluster.VIPCIDR)
	}
	if mode := svc.Status.LoadBalancer.Ingress[0].IPMode; mode == nil || *mode != corev1.LoadBalancerIPModeProxy {
		t.Errorf("ipMode %v, want Proxy", mode)
	}
	if !slices.Contains(svc.Finalizers, lbmodel.CleanupFinalizer) {
		t.Errorf("finalizers %v lack %s", svc.Finalizers, lbmodel.CleanupFinalizer)
	}
	if err := cluster.WaitServiceEndpoints(ctx, ns, "web", 3, time.Minute); err != nil {
		t.Fatal(err)
	}

	url := fmt.Sprintf("http://%s/", net.JoinHostPort(ip, "80"))
	eventually(t, ctx, 30*time.Second, "the first answer through "+url, func(ctx context.Context) (bool, string) {
		_, err := get(ctx, url)
		return err == nil, fmt.Sprint(err)
	})
	want := podNames(t, ctx, ns, "web")
	seen := map[string]bool{}
	for i := 0; i < 90 && len(seen) < len(want); i++ {
		pod, err := get(ctx, url)
		if err != nil {
			t.Fatalf("request %d through the load balancer: %v", i, err)
		}
		seen[pod] = true
	}
	if len(seen) != len(want) {
		t.Errorf("requests through %s reached %d of %d pods: %v", ip, len(seen), len(want), seen)
	}
	events := ebbEvents(t, ctx, ns, "web")
	if !slices.Contains(events, "EnsuredLoadBalancer") {
		t.Errorf("events %v lack EnsuredLoadBalancer", events)
	}
}

// ebbEvents lists the reasons of the events ebb's controller emitted about
// a Service.
func ebbEvents(t *testing.T, ctx context.Context, ns, name string) []string {
	t.Helper()
	list, err := cluster.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.ReportingController == "ebb-service-controller" {
			out = append(out, e.Reason)
		}
	}
	return out
}

// A Service of another class, or without a class, is never touched: no
// address, no finalizer, no events (KEP-1959's e2e test).
func TestServicesOfOtherClassesAreUntouched(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	for name, class := range map[string]*string{"other": ptr.To("example.com/other"), "classless": nil} {
		if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, lbService(ns, name, class), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A Service of ours created after them is served: by then the
	// controller has seen the others.
	if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, lbService(ns, "ours", ebbClass), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitAddress(t, ctx, ns, "ours")
	time.Sleep(time.Second)
	for _, name := range []string{"other", "classless"} {
		svc, err := cluster.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(svc.Status.LoadBalancer.Ingress) != 0 || len(svc.Finalizers) != 0 {
			t.Errorf("%s was touched: status %+v, finalizers %v", name, svc.Status.LoadBalancer, svc.Finalizers)
		}
		if ev := ebbEvents(t, ctx, ns, name); len(ev) != 0 {
			t.Errorf("%s got events from ebb: %v", name, ev)
		}
	}
}

// Deleting the Service closes its listener, removes the finalizer and
// frees the address for the next Service; changing the type to ClusterIP
// does the same.
func TestDeletionAndTypeChangeReleaseTheLoadBalancer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	deployApp(t, ctx, ns, "app", 1)
	svc := lbService(ns, "first", ebbClass)
	svc.Spec.Selector = map[string]string{"app": "app"}
	if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ip := waitAddress(t, ctx, ns, "first")
	url := fmt.Sprintf("http://%s/", net.JoinHostPort(ip, "80"))
	eventually(t, ctx, 30*time.Second, "traffic through "+url, func(ctx context.Context) (bool, string) {
		_, err := get(ctx, url)
		return err == nil, fmt.Sprint(err)
	})

	if err := cluster.Client.CoreV1().Services(ns).Delete(ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 30*time.Second, "the deleted Service to be gone (finalizer removed)", func(ctx context.Context) (bool, string) {
		_, err := cluster.Client.CoreV1().Services(ns).Get(ctx, "first", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	eventually(t, ctx, 10*time.Second, "the listener on "+ip+" to close", func(context.Context) (bool, string) {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "80"), 500*time.Millisecond)
		if err != nil {
			return true, ""
		}
		c.Close()
		return false, "still accepting"
	})

	// The freed address can be asked for by the next Service.
	second := lbService(ns, "second", ebbClass)
	second.Spec.Selector = map[string]string{"app": "app"}
	second.Annotations = map[string]string{"lb.ebb.dev/load-balancer-ips": ip}
	if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, second, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := waitAddress(t, ctx, ns, "second"); got != ip {
		t.Fatalf("second Service got %s, asked for the freed %s", got, ip)
	}
	eventually(t, ctx, 30*time.Second, "traffic through the reused address", func(ctx context.Context) (bool, string) {
		_, err := get(ctx, url)
		return err == nil, fmt.Sprint(err)
	})

	// Type LoadBalancer -> ClusterIP releases it the same way.
	cur, err := cluster.Client.CoreV1().Services(ns).Get(ctx, "second", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Type = corev1.ServiceTypeClusterIP
	cur.Spec.LoadBalancerClass = nil
	cur.Spec.AllocateLoadBalancerNodePorts = nil
	cur.Spec.ExternalTrafficPolicy = ""
	for i := range cur.Spec.Ports {
		cur.Spec.Ports[i].NodePort = 0
	}
	if _, err := cluster.Client.CoreV1().Services(ns).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 30*time.Second, "status and finalizer cleared after the type change", func(ctx context.Context) (bool, string) {
		s, err := cluster.Client.CoreV1().Services(ns).Get(ctx, "second", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(s.Status.LoadBalancer.Ingress) == 0 && len(s.Finalizers) == 0, fmt.Sprintf("status %+v finalizers %v", s.Status.LoadBalancer, s.Finalizers)
	})
	eventually(t, ctx, 10*time.Second, "the listener to close after the type change", func(context.Context) (bool, string) {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "80"), 500*time.Millisecond)
		if err != nil {
			return true, ""
		}
		c.Close()
		return false, "still accepting"
	})
}

// With allocateLoadBalancerNodePorts false the Service has no node ports
// and traffic goes straight to the pods; scaling changes the backends.
func TestPodModeWithoutNodePorts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	deployApp(t, ctx, ns, "direct", 1)
	svc := lbService(ns, "direct", ebbClass)
	svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	created, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range created.Spec.Ports {
		if p.NodePort != 0 {
			t.Fatalf("port %s has node port %d", p.Name, p.NodePort)
		}
	}
	ip := waitAddress(t, ctx, ns, "direct")
	url := fmt.Sprintf("http://%s/", net.JoinHostPort(ip, "80"))
	eventually(t, ctx, 30*time.Second, "traffic straight to the pod", func(ctx context.Context) (bool, string) {
		_, err := get(ctx, url)
		return err == nil, fmt.Sprint(err)
	})

	dep, err := cluster.Client.AppsV1().Deployments(ns).Get(ctx, "direct", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dep.Spec.Replicas = ptr.To[int32](3)
	if _, err := cluster.Client.AppsV1().Deployments(ns).Update(ctx, dep, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitServiceEndpoints(ctx, ns, "direct", 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 30*time.Second, "traffic to all 3 pods after scaling up", func(ctx context.Context) (bool, string) {
		seen := map[string]bool{}
		for range 30 {
			pod, err := get(ctx, url)
			if err != nil {
				return false, err.Error()
			}
			seen[pod] = true
		}
		return len(seen) == 3, fmt.Sprintf("reached %v", seen)
	})
}

// A pod-mode Service whose pods the load balancer cannot reach at all (here
// a targetPort nothing listens on; on a real network, a pod network the LB
// hosts are not part of) gets a Warning event that says what to check, and
// a Normal one once the pods answer.
func TestUnreachablePodBackendsAreReported(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	deployApp(t, ctx, ns, "nowhere", 2)
	svc := lbService(ns, "nowhere", ebbClass)
	svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	svc.Spec.Ports = svc.Spec.Ports[:1]
	svc.Spec.Ports[0].TargetPort = intstr.FromInt32(9999)
	if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitAddress(t, ctx, ns, "nowhere")
	serviceEvent := func(reason string) func(context.Context) (bool, string) {
		return func(ctx context.Context) (bool, string) {
			list, err := cluster.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=nowhere"})
			if err != nil {
				return false, err.Error()
			}
			var seen []string
			for _, e := range list.Items {
				if e.Reason == reason {
					return true, e.Note
				}
				seen = append(seen, e.Reason)
			}
			return false, fmt.Sprintf("events %v", seen)
		}
	}
	eventually(t, ctx, 45*time.Second, "a "+lbsync.ReasonPodBackendsUnreachable+" Warning", serviceEvent(lbsync.ReasonPodBackendsUnreachable))

	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := cluster.Client.CoreV1().Services(ns).Get(ctx, "nowhere", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Spec.Ports[0].TargetPort = intstr.FromInt32(8080)
		_, err = cluster.Client.CoreV1().Services(ns).Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 45*time.Second, "a "+lbsync.ReasonPodBackendsReachable+" event once the pods answer", serviceEvent(lbsync.ReasonPodBackendsReachable))
}

// An SCTP port is refused with a Warning event that says what to change,
// and no address is written.
func TestUnsupportedProtocolIsReported(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	svc := lbService(ns, "sctp", ebbClass)
	svc.Spec.Ports = []corev1.ServicePort{{Name: "sig", Port: 3868, Protocol: corev1.ProtocolSCTP}}
	if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 30*time.Second, "a SyncLoadBalancerFailed event", func(ctx context.Context) (bool, string) {
		notes, err := serviceWarnings(ctx, ns, "sctp", "SyncLoadBalancerFailed")
		if err != nil {
			return false, err.Error()
		}
		return len(notes) > 0, fmt.Sprintf("Warnings %q", notes)
	})
	got, err := cluster.Client.CoreV1().Services(ns).Get(ctx, "sctp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.LoadBalancer.Ingress) != 0 {
		t.Errorf("an SCTP Service got an address: %+v", got.Status.LoadBalancer)
	}
	if !strings.Contains(e2eutil.ControllerMetrics(t, ctx, cluster), `ebb_service_lb_sync_failures_total{reason="unsupported_protocol"}`) {
		t.Error("the controller's metrics do not count the failure")
	}
	kubectlWait(t, ctx, ns, "sctp", "condition=lb.ebb.dev/AddressAssigned=false")
	if reason := kubectlJSONPath(t, ctx, ns, "sctp", `{.status.conditions[?(@.type=="lb.ebb.dev/AddressAssigned")].reason}`); reason != "UnsupportedPort" {
		t.Errorf("the AddressAssigned condition's reason is %q, want UnsupportedPort", reason)
	}
	// No longer a LoadBalancer: nothing of ebb's stays on it.
	cur, err := cluster.Client.CoreV1().Services(ns).Get(ctx, "sctp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Type = corev1.ServiceTypeClusterIP
	cur.Spec.LoadBalancerClass, cur.Spec.AllocateLoadBalancerNodePorts, cur.Spec.ExternalTrafficPolicy = nil, nil, ""
	for i := range cur.Spec.Ports {
		cur.Spec.Ports[i].NodePort = 0
	}
	if _, err := cluster.Client.CoreV1().Services(ns).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 30*time.Second, "the condition and the finalizer gone once it is a ClusterIP Service", func(ctx context.Context) (bool, string) {
		got, err := cluster.Client.CoreV1().Services(ns).Get(ctx, "sctp", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(got.Status.Conditions) == 0 && len(got.Finalizers) == 0, fmt.Sprintf("conditions %+v, finalizers %v", got.Status.Conditions, got.Finalizers)
	})
}

// Two Services that ask to share (the same lb.ebb.dev/allow-shared-ip) and
// whose ports do not collide get one address, and both serve through it.
func TestServicesShareAnAddress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	deployApp(t, ctx, ns, "shared", 1)
	for name, port := range map[string]int32{"shared-a": 80, "shared-b": 8080} {
		svc := lbService(ns, name, ebbClass)
		svc.Spec.Selector = map[string]string{"app": "shared"}
		svc.Annotations = map[string]string{"lb.ebb.dev/allow-shared-ip": "team-a"}
		svc.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: port, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}
		if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	a, b := waitAddress(t, ctx, ns, "shared-a"), waitAddress(t, ctx, ns, "shared-b")
	if a != b {
		t.Fatalf("shared-a got %s and shared-b %s; want one shared address", a, b)
	}
	for _, port := range []string{"80", "8080"} {
		url := fmt.Sprintf("http://%s/", net.JoinHostPort(a, port))
		eventually(t, ctx, 30*time.Second, "traffic through "+url, func(ctx context.Context) (bool, string) {
			_, err := get(ctx, url)
			return err == nil, fmt.Sprint(err)
		})
	}
}

// A tenant who uses another namespace's sharing key gets an address of its
// own, not ports on the other tenant's address (issue 42 item 7), and is
// told why. (A pool with allowSharingAcrossNamespaces shares: unit test
// TestSharingStaysInTheNamespaceAndThePool.)
func TestASharingKeySharesOnlyWithinItsNamespace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	owner, tenant := newNamespace(t, ctx), newNamespace(t, ctx)
	create := func(ns, name string, port int32) {
		t.Helper()
		svc := lbService(ns, name, ebbClass)
		svc.Annotations = map[string]string{"lb.ebb.dev/allow-shared-ip": "guessed"}
		svc.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: port, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}
		if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create(owner, "owner", 80)
	ownerAddr := waitAddress(t, ctx, owner, "owner")
	// Asking for the owner's address by name, with its key: refused.
	create(tenant, "intruder", 8081)
	if _, err := cluster.Client.CoreV1().Services(tenant).Patch(ctx, "intruder", types.MergePatchType,
		[]byte(fmt.Sprintf(`{"metadata":{"annotations":{"lb.ebb.dev/load-balancer-ips":%q}}}`, ownerAddr)), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 30*time.Second, "a Warning that the address is another namespace's", func(ctx context.Context) (bool, string) {
		notes, err := serviceWarnings(ctx, tenant, "intruder", "SyncLoadBalancerFailed")
		if err != nil {
			return false, err.Error()
		}
		for _, n := range notes {
			if strings.Contains(n, "in another namespace") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("Warnings %q", notes)
	})
	svc, err := cluster.Client.CoreV1().Services(tenant).Get(ctx, "intruder", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == ownerAddr {
			t.Fatalf("the tenant's Service got the owner's address %s", ownerAddr)
		}
	}
	// Without the request, the key alone finds no address to share either.
	create(tenant, "guesser", 8082)
	if got := waitAddress(t, ctx, tenant, "guesser"); got == ownerAddr {
		t.Fatalf("a Service of another namespace with the same key got the owner's address %s", got)
	}
}
