package service_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/controller/service"
	"github.com/ebbdev/ebb/internal/lbsync"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/internal/vipaddr"
)

// No address is configured by hand anywhere: ebb lb serves a new Service's
// address through a local route it adds (the address is on no interface),
// and removes the route with the Service. A port on that address held by
// another process skips that one frontend, with a Warning event on the
// Service and a metric, while the Service's other ports and other Services
// keep serving; once the port is free, the frontend serves.
func TestAddressesNeedNoSetUpAndABusyPortBlocksNothingElse(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	vip := netip.MustParseAddr(exposeApp(t, ctx, ns, "web", 2))
	waitServes(t, ctx, fmt.Sprintf("http://%s/", net.JoinHostPort(vip.String(), "80")))

	if on := interfacesWith(t, vip); len(on) > 0 {
		t.Errorf("%s is configured on %v: nothing should configure a VIP on an interface", vip, on)
	}
	routes := lbHostRoutes(t)
	local := func() bool {
		addrs, err := routes.Addresses()
		if err != nil {
			t.Fatal(err)
		}
		return slices.Contains(addrs, vip)
	}
	if !local() {
		t.Fatalf("ebb lb serves %s without its local route (proto %d)", vip, vipaddr.Protocol)
	}

	// Another process on the LB node holds VIP:8080 (bound where the
	// address is local); the Service gains that port.
	busy, err := lbNode.Host.Listen("tcp", net.JoinHostPort(vip.String(), "8080"))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	svc, err := cluster.Client.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "alt", Port: 8080, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP})
	if _, err := cluster.Client.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 30*time.Second, "a Warning event about the busy port", func(ctx context.Context) (bool, string) {
		msgs := serviceEvents(t, ctx, ns, "web", lbsync.ReasonFrontendNotServed)
		for _, m := range msgs {
			if strings.Contains(m, ":alt/TCP@") && strings.Contains(m, "address already in use") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("events %q", msgs)
	})
	if !strings.Contains(lbMetrics(t), `ebb_dataplane_frontend_skipped{frontend="`+ns+`/web:alt/TCP@`+vip.String()+`",reason="ListenFailed"} 1`) {
		t.Error("ebb_dataplane_frontend_skipped does not show the busy frontend")
	}
	// The Service's other port, and a Service created meanwhile, serve.
	otherVIP := exposeApp(t, ctx, ns, "other", 1)
	waitServes(t, ctx, fmt.Sprintf("http://%s/", net.JoinHostPort(otherVIP, "80")))
	if _, err := get(ctx, fmt.Sprintf("http://%s/", net.JoinHostPort(vip.String(), "80"))); err != nil {
		t.Errorf("port 80 of the Service with a busy port: %v", err)
	}

	// The port is freed: ebb lb takes it on its next try.
	_ = busy.Close()
	waitServes(t, ctx, fmt.Sprintf("http://%s/", net.JoinHostPort(vip.String(), "8080")))
	eventually(t, ctx, 10*time.Second, "a Normal event that the frontend serves", func(ctx context.Context) (bool, string) {
		n := len(serviceEvents(t, ctx, ns, "web", lbsync.ReasonFrontendServed))
		return n > 0, fmt.Sprintf("%d events", n)
	})

	// Deleting the Service removes its address from the host.
	if err := cluster.Client.CoreV1().Services(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 30*time.Second, "the local route of "+vip.String()+" removed", func(context.Context) (bool, string) {
		return !local(), "still there"
	})
}

// interfacesWith names the interfaces of the LB node's host, where ebb lb
// runs, that have addr configured.
func interfacesWith(t *testing.T, addr netip.Addr) []string {
	t.Helper()
	var list []netlink.Addr
	if err := lbNode.Host.Do(func() (err error) {
		list, err = netlink.AddrList(nil, netlink.FAMILY_ALL)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr {
			out = append(out, a.Label)
		}
	}
	return out
}

// serviceEvents returns the notes of a Service's events of one reason.
// lbHostRoutes reads the LB node's local routes, which make a served
// address local (a Table reads the namespace it is made in); closed when
// the test ends.
func lbHostRoutes(t *testing.T) *vipaddr.Table {
	t.Helper()
	var routes *vipaddr.Table
	if err := lbNode.Host.Do(func() (err error) {
		routes, err = vipaddr.New()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { routes.Close() })
	return routes
}

// serviceWarnings are the notes of the Warning events with reason about
// the Service ns/name.
func serviceWarnings(ctx context.Context, ns, name, reason string) ([]string, error) {
	list, err := cluster.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + name + ",reason=" + reason})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range list.Items {
		if e.Type == corev1.EventTypeWarning {
			out = append(out, e.Note)
		}
	}
	return out, nil
}

func serviceEvents(t *testing.T, ctx context.Context, ns, name, reason string) []string {
	t.Helper()
	list, err := cluster.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + name + ",reason=" + reason})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Note)
	}
	return out
}

// ebb lb serves and announces only the AddressPools' addresses (issue 42
// item 7): an address written into a Service's status by someone else
// (here with ebb's controller stopped, so that nothing puts it back) is
// not made local on the LB host, and the Service gets a Warning saying
// why, while an address of a pool written the same way is served.
func TestAnAddressOutsideThePoolsIsNotServed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	if err := ebbrun.ScaleController(ctx, cluster, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ebbrun.ScaleController(context.Background(), cluster, 2); err != nil {
			t.Errorf("scaling the controller back: %v", err)
		}
	})
	forged, inPool := netip.MustParseAddr("192.0.2.53"), netip.MustParseAddr("10.96.247.253")
	for name, addr := range map[string]netip.Addr{"forged": forged, "in-pool": inPool} {
		svc := lbService(ns, name, ebbClass)
		created, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: addr.String(), IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}}
		if _, err := cluster.Client.CoreV1().Services(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	routes := lbHostRoutes(t)
	eventually(t, ctx, 30*time.Second, "the pool's address local on the LB host", func(context.Context) (bool, string) {
		addrs, err := routes.Addresses()
		return err == nil && slices.Contains(addrs, inPool), fmt.Sprint(addrs, err)
	})
	eventually(t, ctx, 30*time.Second, "a Warning that the forged address lies in no pool", func(ctx context.Context) (bool, string) {
		msgs := serviceEvents(t, ctx, ns, "forged", lbsync.ReasonFrontendNotServed)
		for _, m := range msgs {
			if strings.Contains(m, "192.0.2.53 lies in no AddressPool") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("events %q", msgs)
	})
	addrs, err := routes.Addresses()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(addrs, forged) {
		t.Errorf("ebb lb made %s local on its host (and announces it), an address of no pool", forged)
	}
}

// Issue 42 item 7: two leaders in a split brain can each give one free
// address to a different Service. Here the two statuses are written with
// the controller stopped, as the two leaders would have left them; when
// it starts, the older Service keeps the address, the younger gets
// another with a Warning naming the older, and both serve. (The names
// sort against the ages: the API lists by name.)
func TestTwoServicesWithOneAddressAreParted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	deployApp(t, ctx, ns, "web", 2)
	if err := ebbrun.ScaleController(ctx, cluster, 0); err != nil {
		t.Fatal(err)
	}
	scaledBack := false
	t.Cleanup(func() {
		if !scaledBack {
			if err := ebbrun.ScaleController(context.Background(), cluster, 2); err != nil {
				t.Errorf("scaling the controller back: %v", err)
			}
		}
	})
	const both = "10.96.247.251"
	for _, name := range []string{"z-older", "a-younger"} {
		svc := lbService(ns, name, ebbClass)
		svc.Spec.Selector = map[string]string{"app": "web"}
		created, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: both, IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}}
		if _, err := cluster.Client.CoreV1().Services(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1100 * time.Millisecond) // creation times a second apart
	}
	if err := ebbrun.ScaleController(ctx, cluster, 2); err != nil {
		t.Fatal(err)
	}
	scaledBack = true
	var moved string
	eventually(t, ctx, time.Minute, "the younger Service at another address", func(ctx context.Context) (bool, string) {
		svc, err := cluster.Client.CoreV1().Services(ns).Get(ctx, "a-younger", metav1.GetOptions{})
		if err != nil || len(svc.Status.LoadBalancer.Ingress) != 1 {
			return false, fmt.Sprint(err)
		}
		moved = svc.Status.LoadBalancer.Ingress[0].IP
		return moved != both, "still " + moved
	})
	if got := waitAddress(t, ctx, ns, "z-older"); got != both {
		t.Errorf("the older Service has %s, want it to keep %s", got, both)
	}
	eventually(t, ctx, 30*time.Second, "a Warning naming the older Service", func(ctx context.Context) (bool, string) {
		evs := serviceEvents(t, ctx, ns, "a-younger", service.ReasonAddressConflict)
		return len(evs) > 0 && strings.Contains(evs[0], "also "+ns+"/z-older's"), fmt.Sprint(evs)
	})
	waitServes(t, ctx, "http://"+both+"/")
	waitServes(t, ctx, "http://"+moved+"/")
}
