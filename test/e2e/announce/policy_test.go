package announce_test

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// AnnouncementPolicies decide which addresses go by BGP and from which
// hosts: a policy announcing the pool by L2 only takes the route off the
// router; one announcing it by BGP from one host leaves that host the only
// next hop; without policies both hosts announce it again.
func TestAnnouncementPolicyDecidesWhatGoesByBGP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	lbA, lbB := cluster.Nodes[0], cluster.Nodes[1]
	startLB(t, ctx, lbA)
	startLB(t, ctx, lbB)
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vip := e2eutil.DeployLoadBalancedEcho(t, ctx, cluster, ns, "web", 1)
	route := netip.PrefixFrom(vip, 32)
	a, b := netip.MustParseAddr(lbA.IP), netip.MustParseAddr(lbB.IP)
	waitNextHops(t, ctx, route, []netip.Addr{a, b})

	api := e2eutil.APIClient(t, cluster)
	policy := &lbv1alpha1.AnnouncementPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "default-by-l2"},
		Spec:       lbv1alpha1.AnnouncementPolicySpec{AddressPools: []string{ebbrun.DefaultPoolName}, L2: &lbv1alpha1.L2Announcement{}},
	}
	if err := api.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Delete(context.Background(), policy) })
	waitNextHops(t, ctx, route, nil)
	t.Logf("%s by L2 only: the router has no route to it", vip)

	// Merge patches of the spec, as kubectl does: the controller writes
	// the status meanwhile.
	patch := func(mutate func(*lbv1alpha1.AnnouncementPolicySpec)) {
		t.Helper()
		before := policy.DeepCopy()
		mutate(&policy.Spec)
		if err := api.Patch(ctx, policy, ctrlclient.MergeFrom(before)); err != nil {
			t.Fatal(err)
		}
	}
	patch(func(s *lbv1alpha1.AnnouncementPolicySpec) {
		s.L2, s.BGP = nil, &lbv1alpha1.BGPAnnouncement{}
		s.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelHostname: lbB.Name}}
	})
	waitNextHops(t, ctx, route, []netip.Addr{b})
	waitPolicyColumns(t, ctx, policy.Name, "BGP", "1", "True")

	// A pool that does not exist is said in the policy's status.
	patch(func(s *lbv1alpha1.AnnouncementPolicySpec) { s.AddressPools = append(s.AddressPools, "nowhere") })
	waitPolicyColumns(t, ctx, policy.Name, "BGP", "1", "False")

	if err := api.Delete(ctx, policy); err != nil {
		t.Fatal(err)
	}
	waitNextHops(t, ctx, route, []netip.Addr{a, b})
}

// waitPolicyColumns waits until kubectl get announcementpolicy shows the
// policy's BY, HOSTS and READY columns as want.
func waitPolicyColumns(t *testing.T, ctx context.Context, name, by, hosts, ready string) {
	t.Helper()
	var out []byte
	e2eutil.Eventually(t, ctx, 30*time.Second, fmt.Sprintf("AnnouncementPolicy %s showing %s from %s hosts, Ready %s", name, by, hosts, ready), func(ctx context.Context) (bool, string) {
		var err error
		out, err = exec.CommandContext(ctx, filepath.Join(cluster.BinDir, "kubectl"), "--kubeconfig", cluster.Kubeconfig, "get", "announcementpolicy", name).CombinedOutput()
		if err != nil {
			return false, fmt.Sprintf("%v: %s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "NAME ") || !strings.Contains(lines[0], "HOSTS") {
			return false, string(out)
		}
		// NAME POOLS BY HOSTS READY AGE
		f := strings.Fields(lines[1])
		return len(f) == 6 && f[2] == by && f[3] == hosts && f[4] == ready, string(out)
	})
	t.Logf("kubectl get announcementpolicy %s:\n%s", name, out)
}
