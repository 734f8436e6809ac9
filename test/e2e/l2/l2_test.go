package l2_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// Two LB hosts announce two Services' addresses on the segment: each
// address has one owner, whose MAC the router's neighbour table holds. An
// owner that stops (its pod removed from the host) hands its address to
// the other before it stops accepting, so under load no request fails; an
// owner whose host vanishes loses its address once the other misses its
// heartbeats, and traffic resumes through the other.
func TestL2OwnerHandsOverAndAVanishedOwnerIsReplaced(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	lbs := []localcluster.Node{cluster.Nodes[0], cluster.Nodes[1]}
	stops, macs := lbHosts(t, ctx, lbs...)
	other := func(name string) localcluster.Node {
		if name == lbs[0].Name {
			return lbs[1]
		}
		return lbs[0]
	}
	// The apps run on the third node: hosts cut off below take no pod
	// with them.
	offLB := func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: cluster.Nodes[2].Name}
	}
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vips := []netip.Addr{
		e2eutil.DeployLoadBalancedEcho(t, ctx, cluster, ns, "web-a", 1, offLB),
		e2eutil.DeployLoadBalancedEcho(t, ctx, cluster, ns, "web-b", 1, offLB),
	}
	// Only the app's node is a backend (externalTrafficPolicy Local), so
	// what a vanished LB host costs is the announcement's alone, not also
	// the load balancers' probes finding its node port gone.
	for _, name := range []string{"web-a", "web-b"} {
		patch := []byte(`{"spec":{"externalTrafficPolicy":"Local"}}`)
		if _, err := cluster.Client.CoreV1().Services(ns).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cluster.ExternalClient.DialContext}}
	ownerOf := func(vip netip.Addr) string { return routerOwner(macs, vip) }
	for _, vip := range vips {
		url := fmt.Sprintf("http://%s/", vip)
		e2eutil.Eventually(t, ctx, 30*time.Second, "the client reaching "+url, func(ctx context.Context) (bool, string) {
			err := e2eutil.Answered(ctx, cluster, client, url)
			return err == nil, fmt.Sprint(err)
		})
		if ownerOf(vip) == "" {
			mac, _, _ := cluster.Router.Neighbour(vip)
			t.Fatalf("the router's neighbour entry for %s is %v, the MAC of no LB host %v", vip, mac, macs)
		}
		t.Logf("%s is at %s", vip, ownerOf(vip))
	}
	// Each address has exactly one owner, by the replicas' own account.
	owned := 0.0
	for _, n := range lbs {
		page, err := ebbrun.LBPage(ctx, cluster, n, "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		owned += e2eutil.Sum(page, "ebb_lb_l2_owned_addresses")
	}
	if owned != float64(len(vips)) {
		t.Fatalf("the LB hosts own %v addresses together, want %d (one owner each)", owned, len(vips))
	}
	// And in the API: each address in exactly one replica's report, the
	// one on the host the router sends it to.
	e2eutil.Eventually(t, ctx, 10*time.Second, "the reports naming each address's owner", func(ctx context.Context) (bool, string) {
		reports := &v1alpha1.LoadBalancerReportList{}
		if err := e2eutil.APIClient(t, cluster).List(ctx, reports); err != nil {
			return false, err.Error()
		}
		owners := map[string][]string{}
		for _, r := range reports.Items {
			if r.Status.Announcement != nil {
				for _, a := range r.Status.Announcement.L2Owned {
					owners[a] = append(owners[a], r.Status.HostNode)
				}
			}
		}
		for _, vip := range vips {
			if o := owners[vip.String()]; len(o) != 1 || o[0] != ownerOf(vip) {
				return false, fmt.Sprintf("%s owned by %v in the reports, the router sends it to %s", vip, o, ownerOf(vip))
			}
		}
		return true, ""
	})

	// A graceful stop: the owner's ebb lb pod goes (its node is no longer
	// an LB node). It offers nothing from the first moment of its stop,
	// the other takes the address over and announces it, and it keeps
	// accepting meanwhile: no request fails.
	vip := vips[0]
	owner := ownerOf(vip)
	load := startLoad(vip)
	time.Sleep(time.Second)
	stops[owner]()
	e2eutil.Eventually(t, ctx, 30*time.Second, fmt.Sprintf("the router sending %s to %s", vip, other(owner).Name), func(context.Context) (bool, string) {
		return ownerOf(vip) == other(owner).Name, "at " + ownerOf(vip)
	})
	time.Sleep(2 * time.Second)
	load.Stop()
	if sent, failed := load.Counts(); failed > 0 || sent == 0 {
		t.Fatalf("%d of %d requests failed while %s handed %s over (last: %s)", failed, sent, owner, vip, load.LastError())
	} else {
		t.Logf("%s handed %s to %s: 0 of %d requests failed", owner, vip, other(owner).Name, sent)
	}

	// The host comes back as an LB node; then the owner of the address
	// vanishes from the network.
	back := other(other(owner).Name)
	stops[owner] = e2eutil.StartLB(t, ctx, cluster, back)
	// Ready is not yet serving every address: the host's stopping ebb lb
	// still holds the listeners until its --shutdown-delay ends, and the
	// new one binds them then (docs/dataplane.md). Only a replica that
	// offers an address can take it over.
	e2eutil.Eventually(t, ctx, 30*time.Second, back.Name+"'s ebb lb offering both addresses", func(ctx context.Context) (bool, string) {
		page, err := ebbrun.LBPage(ctx, cluster, back, "/metrics")
		if err != nil {
			return false, err.Error()
		}
		n := e2eutil.Sum(page, "ebb_lb_l2_offered_addresses")
		return n == float64(len(vips)), fmt.Sprintf("offered %v", n)
	})
	time.Sleep(time.Second) // its offer heard by the other replica
	owner = ownerOf(vip)
	load = startLoad(vip)
	time.Sleep(time.Second)
	cut := time.Now()
	if err := cluster.Disconnect(owner); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Reconnect(owner) })
	e2eutil.Eventually(t, ctx, 30*time.Second, fmt.Sprintf("the router sending %s to %s", vip, other(owner).Name), func(context.Context) (bool, string) {
		return ownerOf(vip) == other(owner).Name, "at " + ownerOf(vip)
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
	t.Logf("%s cut off: the router's entry seen moved to %s %s later; %d of %d requests failed", owner, other(owner).Name, moved.Round(time.Millisecond), failed, sent)
	if failed > 0 {
		t.Logf("the last failed request was sent %s after the cut", lastFailed.Round(time.Millisecond))
	}
	// Requests sent once the router sends the address to the other host
	// succeed: asserted on what happened, not on a time bound, which a
	// loaded machine would break now and then (issue 50 item 20). How
	// long the takeover takes is bench-failover's figure.
	if lastFailed > moved {
		t.Fatalf("a request sent %s after %s was cut off, when the router had moved the address (%s), still failed (%d of %d failed; last: %s)", lastFailed, owner, moved.Round(time.Millisecond), failed, sent, load.LastError())
	}
}

// startLoad sends 100 requests a second to vip from the client host.
func startLoad(vip netip.Addr) *loadgen.Requests {
	r := &loadgen.Requests{URL: fmt.Sprintf("http://%s/", net.JoinHostPort(vip.String(), "80")), Rate: 100, Dial: cluster.ExternalClient.DialContext}
	r.Start()
	return r
}
