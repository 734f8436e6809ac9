package network

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestAddRouteFromPicksTheSource routes a subnet from one host through
// another with a preferred source, and checks that a connection along the
// route leaves from that address, not from the interface's first one.
func TestAddRouteFromPicksTheSource(t *testing.T) {
	client, err := NewHost("ebb-test-client")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := NewHost("ebb-test-server")
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()

	first, preferred := netip.MustParsePrefix("10.79.1.2/24"), netip.MustParsePrefix("10.79.1.3/24")
	gateway := netip.MustParsePrefix("10.79.1.1/24")
	if err := LinkHosts(client, "eth0", []netip.Prefix{first, preferred}, server, "eth0", []netip.Prefix{gateway}); err != nil {
		t.Fatal(err)
	}
	// The destination is a subnet of the server's own, on its loopback:
	// reaching it needs the route through the gateway.
	if err := server.AddAddress("lo", netip.MustParsePrefix("10.79.2.0/24")); err != nil {
		t.Fatal(err)
	}
	if err := client.AddRouteFrom(netip.MustParsePrefix("10.79.2.0/24"), gateway.Addr(), preferred.Addr()); err != nil {
		t.Fatal(err)
	}

	ln, err := server.Listen("tcp", "10.79.2.7:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Addr, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- c.RemoteAddr()
		_ = c.Close()
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dialing along the route: %v", err)
	}
	defer c.Close()
	var from net.Addr
	select {
	case from = <-accepted:
	case <-ctx.Done():
		t.Fatal("the server accepted nothing")
	}
	got, err := netip.ParseAddrPort(from.String())
	if err != nil {
		t.Fatalf("the server saw %v: %v", from, err)
	}
	if got.Addr() != preferred.Addr() {
		t.Errorf("the connection came from %s, want the route's preferred source %s", got.Addr(), preferred.Addr())
	}
}
