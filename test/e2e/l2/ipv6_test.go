package l2_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// A dual-stack Service's IPv6 address is announced by NDP: the router
// resolves it to one LB host's MAC, and when that host vanishes the other
// takes the address over with an unsolicited neighbour advertisement, so
// the router's entry moves and requests to the IPv6 address resume.
func TestL2IPv6AddressIsOwnedByOneHostAndTakenOver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	lbs := []localcluster.Node{cluster.Nodes[0], cluster.Nodes[1]}
	_, macs := lbHosts(t, ctx, lbs...)
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vips := e2eutil.DeployLoadBalancedEchoService(t, ctx, cluster, ns, "web", 1, func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
		// Only the app's node is a backend: a vanished LB host costs the
		// announcement's failover alone.
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}, func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: cluster.Nodes[2].Name}
	})
	if len(vips) != 2 || !vips[1].Is6() {
		t.Fatalf("a RequireDualStack Service got addresses %v, want an IPv4 and then an IPv6 one", vips)
	}
	vip := vips[1]
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cluster.ExternalClient.DialContext}}
	url := fmt.Sprintf("http://%s/", net.JoinHostPort(vip.String(), "80"))
	e2eutil.Eventually(t, ctx, 30*time.Second, "the client reaching "+url, func(ctx context.Context) (bool, string) {
		err := e2eutil.Answered(ctx, cluster, client, url)
		return err == nil, fmt.Sprint(err)
	})
	owner := routerOwner(macs, vip)
	if owner == "" {
		mac, _, _ := cluster.Router.Neighbour(vip)
		t.Fatalf("the router's neighbour entry for %s is %v, the MAC of no LB host %v", vip, mac, macs)
	}
	other := lbs[0]
	if other.Name == owner {
		other = lbs[1]
	}
	t.Logf("%s is at %s", vip, owner)

	load := startLoad(vip)
	time.Sleep(time.Second)
	cut := time.Now()
	if err := cluster.Disconnect(owner); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Reconnect(owner) })
	e2eutil.Eventually(t, ctx, 30*time.Second, fmt.Sprintf("the router sending %s to %s", vip, other.Name), func(context.Context) (bool, string) {
		o := routerOwner(macs, vip)
		return o == other.Name, "at " + o
	})
	moved := time.Since(cut)
	time.Sleep(3 * time.Second)
	load.Stop()
	sent, failed := load.Counts()
	var lastFailed time.Duration
	for _, s := range load.Samples() {
		if s.Failed {
			lastFailed = s.At - cut.Sub(load.Started())
		}
	}
	t.Logf("%s cut off: the router's IPv6 entry seen moved to %s %s later; %d of %d requests failed", owner, other.Name, moved.Round(time.Millisecond), failed, sent)
	if sent == 0 {
		t.Fatal("no request was sent")
	}
	// Requests sent once the router sends the address to the other host
	// succeed: asserted on what happened, not on a time bound, which a
	// loaded machine would break now and then (issue 50 item 20). How
	// long the takeover takes is bench-failover's figure.
	if lastFailed > moved {
		t.Fatalf("a request sent %s after %s was cut off, when the router had moved the address (%s), still failed (%d of %d failed; last: %s)", lastFailed, owner, moved.Round(time.Millisecond), failed, sent, load.LastError())
	}
}
