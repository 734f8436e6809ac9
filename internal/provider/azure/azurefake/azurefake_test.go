package azurefake

import (
	"context"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

// Requests cancelled while the fake answers them end with an error, never
// with a panic (the SDK's fake transports send on a closed channel when a
// request's context ends first: CI lost a whole suite to it).
func TestCancelledRequestsDoNotPanic(t *testing.T) {
	cloud := New()
	cloud.AddPool("kubernetes", armnetwork.BackendAddressPool{Name: new("kubernetes")})
	client, err := armnetwork.NewLoadBalancerBackendAddressPoolsClient("s", Credential{}, cloud.ClientOptions())
	if err != nil {
		t.Fatal(err)
	}
	for range 3000 {
		ctx, cancel := context.WithCancel(context.Background())
		go cancel()
		_, _ = client.Get(ctx, "rg", "kubernetes", "kubernetes", nil)
	}
}
