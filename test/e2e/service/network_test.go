package service_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// A user's client sits on another subnet: it reaches a LoadBalancer
// Service's address through the router and only through it (the router
// knows the VIP pool by a static route until ebb announces it).
func TestClientBehindTheRouterReachesTheLoadBalancer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	vip := exposeApp(t, ctx, ns, "web", 2)
	url := fmt.Sprintf("http://%s/", net.JoinHostPort(vip, "80"))
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext:       cluster.ExternalClient.DialContext,
	}}
	fromClient := func(ctx context.Context) (string, error) { return getVia(ctx, client, url) }
	eventually(t, ctx, 30*time.Second, "the client reaching "+url, func(ctx context.Context) (bool, string) {
		_, err := fromClient(ctx)
		return err == nil, fmt.Sprint(err)
	})
	for i := range 20 {
		if _, err := fromClient(ctx); err != nil {
			t.Fatalf("request %d from the client: %v", i, err)
		}
	}

	// Without the router's route to the pool the address is unreachable:
	// the client has no other way in.
	if err := cluster.Router.DeleteRoute(localcluster.VIPPrefix); err != nil {
		t.Fatal(err)
	}
	restore := func() {
		if err := ebbrun.RouteVIPsTo(cluster, lbNode); err != nil {
			t.Fatal(err)
		}
	}
	_, err := fromClient(ctx)
	restore()
	if err == nil {
		t.Fatalf("the client reached %s without the router's route: it bypasses the router", vip)
	}
	if _, err := fromClient(ctx); err != nil {
		t.Fatalf("the client cannot reach %s once the route is back: %v", vip, err)
	}
}

// A load-balancer address is a Service's, not the LB host's: a service of
// the host listening on all addresses (sshd, the kubelet) answers on the
// host's own address, never through the address ebb announces; the
// Service's port still does.
func TestTheLBHostsOwnServicesAreNotReachableOnAServiceAddress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	vip := exposeApp(t, ctx, ns, "web", 1)
	waitServes(t, ctx, fmt.Sprintf("http://%s/", net.JoinHostPort(vip, "80")))

	ln, err := lbNode.Host.Listen("tcp", "0.0.0.0:2222")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	reaches := func(address string) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		c, err := cluster.ExternalClient.DialContext(ctx, "tcp", address)
		if err != nil {
			return err
		}
		return c.Close()
	}
	if err := reaches(net.JoinHostPort(lbNode.IP, "2222")); err != nil {
		t.Fatalf("the LB host's own service on its own address %s: %v", lbNode.IP, err)
	}
	if err := reaches(net.JoinHostPort(vip, "2222")); err == nil {
		t.Fatalf("the LB host's own service (port 2222) answered on the Service's address %s", vip)
	}
	if err := reaches(net.JoinHostPort(vip, "80")); err != nil {
		t.Fatalf("the Service's own port on %s: %v", vip, err)
	}
	if got := e2eutil.Sum(lbMetrics(t), "ebb_lb_guard_dropped_packets_total"); got == 0 {
		t.Error("ebb_lb_guard_dropped_packets_total is 0 after a connection to port 2222 of a Service's address")
	}

	// A firewall reload removes the guard's table (here only ebb's, so
	// that kube-proxy's rules on the node stay): ebb lb writes it again
	// within its repair period and says so on the node.
	repairs := e2eutil.Sum(lbMetrics(t), "ebb_lb_kernel_state_repairs_total")
	if err := lbNode.Host.Do(func() error { return exec.Command("nft", "delete", "table", "inet", "ebb-guard").Run() }); err != nil {
		t.Fatal(err)
	}
	// (Port 2222 is reachable on the address now, until the repair, which
	// may come at once: the repair is what the test waits for.)
	eventually(t, ctx, 15*time.Second, "the guard's table repaired", func(context.Context) (bool, string) {
		err := reaches(net.JoinHostPort(vip, "2222"))
		return err != nil, "port 2222 of the Service's address still reaches the LB host's own service"
	})
	if got := e2eutil.Sum(lbMetrics(t), "ebb_lb_kernel_state_repairs_total"); got <= repairs {
		t.Errorf("ebb_lb_kernel_state_repairs_total = %v after the repair, want more than %v", got, repairs)
	}
	eventually(t, ctx, 15*time.Second, "a KernelStateRepaired event on "+lbNode.Name, func(ctx context.Context) (bool, string) {
		n := nodeEvents(t, ctx, lbNode.Name, "KernelStateRepaired")
		return n > 0, "none"
	})
}
