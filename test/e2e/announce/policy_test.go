package announce_test

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
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

// A policy naming an interface starts L2 announcement on hosts whose
// ebb lb was not given --l2-interface: each address gets one owner among
// the LB hosts (their reports and the policy's status say which), beside
// BGP from another policy; deleting it lets the addresses go.
func TestAnnouncementPolicyStartsL2OnAnInterface(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	lbA, lbB := cluster.Nodes[0], cluster.Nodes[1]
	startLB(t, ctx, lbA)
	startLB(t, ctx, lbB)
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vip := e2eutil.DeployLoadBalancedEcho(t, ctx, cluster, ns, "web", 1)
	api := e2eutil.APIClient(t, cluster)
	bgp := &lbv1alpha1.AnnouncementPolicy{ObjectMeta: metav1.ObjectMeta{Name: "all-by-bgp"}, Spec: lbv1alpha1.AnnouncementPolicySpec{BGP: &lbv1alpha1.BGPAnnouncement{}}}
	l2 := &lbv1alpha1.AnnouncementPolicy{ObjectMeta: metav1.ObjectMeta{Name: "all-by-l2"}, Spec: lbv1alpha1.AnnouncementPolicySpec{L2: &lbv1alpha1.L2Announcement{Interfaces: []string{"eth0"}}}}
	for _, p := range []*lbv1alpha1.AnnouncementPolicy{bgp, l2} {
		if err := api.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = api.Delete(context.Background(), p) })
	}
	waitNextHops(t, ctx, netip.PrefixFrom(vip, 32), []netip.Addr{netip.MustParseAddr(lbA.IP), netip.MustParseAddr(lbB.IP)})
	owners := func(ctx context.Context) ([]string, error) {
		var out []string
		for _, n := range []string{lbA.Name, lbB.Name} {
			r, err := e2eutil.ReportOn(ctx, api, n)
			if err != nil {
				return nil, err
			}
			if a := r.Status.Announcement; a != nil && slices.Contains(a.L2Owned, vip.String()) {
				out = append(out, n)
			}
		}
		return out, nil
	}
	var owner string
	e2eutil.Eventually(t, ctx, 30*time.Second, "one LB host owning "+vip.String()+" by L2, in the reports and the policy's status", func(ctx context.Context) (bool, string) {
		o, err := owners(ctx)
		if err != nil || len(o) != 1 {
			return false, fmt.Sprint(o, err)
		}
		owner = o[0]
		var got lbv1alpha1.AnnouncementPolicy
		if err := api.Get(ctx, ctrlclient.ObjectKeyFromObject(l2), &got); err != nil {
			return false, err.Error()
		}
		return fmt.Sprint(got.Status.L2Owners) == fmt.Sprintf("[{%s %s}]", vip, owner) && got.Status.AnnouncedBy == "L2", fmt.Sprintf("%+v", got.Status)
	})
	t.Logf("%s owned by %s on eth0", vip, owner)

	if err := api.Delete(ctx, l2); err != nil {
		t.Fatal(err)
	}
	e2eutil.Eventually(t, ctx, 30*time.Second, "no LB host owning "+vip.String()+" once the L2 policy is gone", func(ctx context.Context) (bool, string) {
		o, err := owners(ctx)
		return err == nil && len(o) == 0, fmt.Sprint(o, err)
	})
}

// The API refuses an AnnouncementPolicy that announces nothing, or names
// an interface no Linux host can have, saying what to fix.
func TestAnnouncementPolicyValidation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api := e2eutil.APIClient(t, cluster)
	tests := []struct {
		name string
		spec lbv1alpha1.AnnouncementPolicySpec
		want string
	}{
		{"neither bgp nor l2", lbv1alpha1.AnnouncementPolicySpec{AddressPools: []string{"default"}}, "say how the addresses are announced: bgp: {}, l2: {} or both"},
		{"interface name too long", lbv1alpha1.AnnouncementPolicySpec{L2: &lbv1alpha1.L2Announcement{Interfaces: []string{"an-interface-name-longer-than-15"}}}, "spec.l2.interfaces[0]"},
		{"community part above 65535", lbv1alpha1.AnnouncementPolicySpec{BGP: &lbv1alpha1.BGPAnnouncement{Communities: []string{"64512:100", "70000:1"}}}, "each community is ASN:VALUE with both parts 0 to 65535 (as 64512:100), or no-export"},
		{"community of another form", lbv1alpha1.AnnouncementPolicySpec{BGP: &lbv1alpha1.BGPAnnouncement{Communities: []string{"noexport"}}}, "each community is ASN:VALUE"},
		{"large community of two parts", lbv1alpha1.AnnouncementPolicySpec{BGP: &lbv1alpha1.BGPAnnouncement{LargeCommunities: []string{"4200000000:1"}}}, "each large community is GLOBAL:LOCAL1:LOCAL2"},
		{"large community part above 32 bits", lbv1alpha1.AnnouncementPolicySpec{BGP: &lbv1alpha1.BGPAnnouncement{LargeCommunities: []string{"4294967296:1:2"}}}, "every part 0 to 4294967295"},
		{"aggregation without pools", lbv1alpha1.AnnouncementPolicySpec{BGP: &lbv1alpha1.BGPAnnouncement{AggregationLength: ptrTo[int32](24)}}, "bgp.aggregationLength and aggregationLengthV6 need addressPools"},
		{"aggregation shorter than /8", lbv1alpha1.AnnouncementPolicySpec{AddressPools: []string{"default"}, BGP: &lbv1alpha1.BGPAnnouncement{AggregationLength: ptrTo[int32](7)}}, "spec.bgp.aggregationLength"},
		{"IPv6 aggregation longer than /128", lbv1alpha1.AnnouncementPolicySpec{AddressPools: []string{"default"}, BGP: &lbv1alpha1.BGPAnnouncement{AggregationLengthV6: ptrTo[int32](129)}}, "spec.bgp.aggregationLengthV6"},
		{"negative local preference", lbv1alpha1.AnnouncementPolicySpec{BGP: &lbv1alpha1.BGPAnnouncement{LocalPreference: ptrTo[int64](-1)}}, "spec.bgp.localPreference"},
	}
	for _, tt := range tests {
		p := &lbv1alpha1.AnnouncementPolicy{ObjectMeta: metav1.ObjectMeta{Name: "invalid"}, Spec: tt.spec}
		err := api.Create(ctx, p)
		if err == nil {
			_ = api.Delete(ctx, p)
			t.Errorf("%s: created", tt.name)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q in it", tt.name, err, tt.want)
		}
	}
	// The smallest valid policy is accepted.
	ok := &lbv1alpha1.AnnouncementPolicy{ObjectMeta: metav1.ObjectMeta{Name: "valid"}, Spec: lbv1alpha1.AnnouncementPolicySpec{BGP: &lbv1alpha1.BGPAnnouncement{}, AddressPools: []string{"no-such-pool"}}}
	if err := api.Create(ctx, ok); err != nil {
		t.Fatalf("creating a policy with bgp: {}: %v", err)
	}
	if err := api.Delete(ctx, ok); err != nil {
		t.Fatal(err)
	}
	// So is one with every attribute at its limits.
	full := &lbv1alpha1.AnnouncementPolicy{ObjectMeta: metav1.ObjectMeta{Name: "valid-attributes"}, Spec: lbv1alpha1.AnnouncementPolicySpec{AddressPools: []string{"no-such-pool"}, BGP: &lbv1alpha1.BGPAnnouncement{
		Communities:       []string{"0:0", "65535:65535", "no-export", "no-advertise", "no-export-subconfed", "no-peer", "graceful-shutdown", "blackhole"},
		LargeCommunities:  []string{"0:0:0", "4294967295:4294967295:4294967295"},
		LocalPreference:   ptrTo[int64](4294967295),
		AggregationLength: ptrTo[int32](32), AggregationLengthV6: ptrTo[int32](16),
	}}}
	if err := api.Create(ctx, full); err != nil {
		t.Fatalf("creating a policy with every attribute at its limits: %v", err)
	}
	if err := api.Delete(ctx, full); err != nil {
		t.Fatal(err)
	}
}
