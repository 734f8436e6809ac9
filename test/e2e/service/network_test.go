package service_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/internal/localcluster/podserver"
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
	fromClient := func(ctx context.Context) (podserver.Identity, error) { return getVia(ctx, client, url) }
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
