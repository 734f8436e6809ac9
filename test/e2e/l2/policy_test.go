package l2_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// An AnnouncementPolicy decides which hosts announce an address by L2
// and on which interfaces: limited to the host that does not own it, the
// address moves there (the router's entry follows, the policy's status
// names the new owner); limited to an interface no host has, nobody owns
// it; on eth0 again, the chosen host does.
func TestAnnouncementPolicyChoosesTheL2Owner(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	lbs := []localcluster.Node{cluster.Nodes[0], cluster.Nodes[1]}
	_, macs := lbHosts(t, ctx, lbs...)
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vip := e2eutil.DeployLoadBalancedEcho(t, ctx, cluster, ns, "web", 1, func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: cluster.Nodes[2].Name}
	})
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cluster.ExternalClient.DialContext}}
	url := fmt.Sprintf("http://%s/", vip)
	reach := func(what string) {
		t.Helper()
		e2eutil.Eventually(t, ctx, 30*time.Second, "the client reaching "+url+" "+what, func(ctx context.Context) (bool, string) {
			err := e2eutil.Answered(ctx, cluster, client, url)
			return err == nil, fmt.Sprint(err)
		})
	}
	reach("before any policy")
	ownerOf := func() string { return routerOwner(macs, vip) }
	first := ownerOf()
	chosen := lbs[0].Name
	if first == chosen {
		chosen = lbs[1].Name
	}
	t.Logf("%s owned by %s; the policy chooses %s", vip, first, chosen)

	api := e2eutil.APIClient(t, cluster)
	policy := &lbv1alpha1.AnnouncementPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "l2-on-one-host"},
		Spec: lbv1alpha1.AnnouncementPolicySpec{L2: &lbv1alpha1.L2Announcement{},
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelHostname: chosen}}},
	}
	if err := api.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Delete(context.Background(), policy) })
	waitOwners := func(want string) {
		t.Helper()
		e2eutil.Eventually(t, ctx, 30*time.Second, fmt.Sprintf("the policy's status naming %s as %s's owner", want, vip), func(ctx context.Context) (bool, string) {
			var got lbv1alpha1.AnnouncementPolicy
			if err := api.Get(ctx, ctrlclient.ObjectKeyFromObject(policy), &got); err != nil {
				return false, err.Error()
			}
			owners := fmt.Sprint(got.Status.L2Owners)
			if want == "" {
				return len(got.Status.L2Owners) == 0 && got.Status.Hosts == 1, owners
			}
			return owners == fmt.Sprintf("[{%s %s}]", vip, want) && got.Status.Hosts == 1, owners
		})
	}
	waitOwners(chosen)
	e2eutil.Eventually(t, ctx, 10*time.Second, "the router's entry for "+vip.String()+" moving to "+chosen, func(context.Context) (bool, string) {
		o := ownerOf()
		return o == chosen, o
	})
	reach("through " + chosen)

	// A merge patch of the spec, as kubectl does: the controller writes
	// the status meanwhile.
	setInterfaces := func(names ...string) {
		t.Helper()
		before := policy.DeepCopy()
		policy.Spec.L2.Interfaces = names
		if err := api.Patch(ctx, policy, ctrlclient.MergeFrom(before)); err != nil {
			t.Fatal(err)
		}
	}
	setInterfaces("eth9")
	waitOwners("")

	setInterfaces("eth0")
	waitOwners(chosen)
	reach("through " + chosen + " on eth0")
	if o := ownerOf(); o != chosen {
		t.Fatalf("the router's entry for %s names %q, want %s", vip, o, chosen)
	}
}
