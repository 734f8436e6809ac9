package lb

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbsync"
)

// The L2 offer keeps the addresses some policy announces by L2, limited to
// the policies' interfaces this replica has open; an address limited to
// none of them is not offered at all (another replica may own it).
func TestL2Offer(t *testing.T) {
	pools := []lbv1alpha1.AddressPool{
		{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: lbv1alpha1.AddressPoolSpec{Addresses: []string{"10.0.1.0/28"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: lbv1alpha1.AddressPoolSpec{Addresses: []string{"10.0.2.0/28"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: lbv1alpha1.AddressPoolSpec{Addresses: []string{"10.0.3.0/28"}}},
	}
	l2 := func(name, pool string, ifaces ...string) lbv1alpha1.AnnouncementPolicy {
		return lbv1alpha1.AnnouncementPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lbv1alpha1.AnnouncementPolicySpec{
			AddressPools: []string{pool}, L2: &lbv1alpha1.L2Announcement{Interfaces: ifaces}}}
	}
	plan, _ := lbsync.PlanAnnouncements(nil, []lbv1alpha1.AnnouncementPolicy{l2("a", "a"), l2("b", "b", "eth1", "eth9"), l2("c", "c", "eth9")}, pools)
	a, b, c, d := netip.MustParseAddr("10.0.1.1"), netip.MustParseAddr("10.0.2.1"), netip.MustParseAddr("10.0.3.1"), netip.MustParseAddr("10.0.4.1")
	offer, only := l2Offer([]netip.Addr{a, b, c, d}, plan, []string{"eth0", "eth1"})
	if fmt.Sprint(offer) != fmt.Sprint([]netip.Addr{a, b}) || fmt.Sprint(only) != fmt.Sprint(map[netip.Addr][]string{b: {"eth1"}}) {
		t.Errorf("offer %v only %v; want [%s %s] and %s on eth1 only", offer, only, a, b, b)
	}
	offer, only = l2Offer([]netip.Addr{a, d}, lbsync.AnnouncementPlan{}, []string{"eth0"})
	if len(offer) != 2 || len(only) != 0 {
		t.Errorf("without policies: offer %v only %v; want both, unlimited", offer, only)
	}
}

// ebb lb's cache holds the Secrets labeled as BGP passwords in its
// namespace, no other (issue 42 item 3: it held every Secret of ebb-system,
// the webhook's CA key and a cloud credential among them), and of Nodes
// only its own.
func TestCacheScope(t *testing.T) {
	scope := cacheScope("ebb-system", "node-1")
	var secrets, nodes ctrlcache.ByObject
	for obj, by := range scope {
		switch obj.(type) {
		case *corev1.Secret:
			secrets = by
		case *corev1.Node:
			nodes = by
		default:
			t.Errorf("a scope for %T", obj)
		}
	}
	if _, ok := secrets.Namespaces["ebb-system"]; !ok || len(secrets.Namespaces) != 1 {
		t.Errorf("Secrets cached in %v, want ebb-system only", secrets.Namespaces)
	}
	for _, c := range []struct {
		labels map[string]string
		cached bool
	}{
		{map[string]string{lbv1alpha1.PasswordSecretLabel: "true"}, true},
		{map[string]string{lbv1alpha1.PasswordSecretLabel: "false"}, false},
		{nil, false},
		{map[string]string{"app": "ebb"}, false},
	} {
		if secrets.Label == nil {
			t.Fatal("every Secret of the namespace is cached: no label selector")
		}
		if got := secrets.Label.Matches(labels.Set(c.labels)); got != c.cached {
			t.Errorf("a Secret labeled %v cached: %v, want %v", c.labels, got, c.cached)
		}
	}
	if nodes.Field == nil || nodes.Field.String() != "metadata.name=node-1" {
		t.Errorf("Nodes cached by %v, want its own", nodes.Field)
	}
}
