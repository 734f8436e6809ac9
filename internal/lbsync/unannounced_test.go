package lbsync

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	"github.com/ebbdev/ebb/internal/dataplane"
)

// An address that cannot be announced is reported once on each Service
// with a frontend at it (two ports of one Service: one event), a changed
// reason again, and the recovery once.
func TestUnannouncedReporterReportsChangesOnServices(t *testing.T) {
	web := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}}
	dns := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "dns"}}
	cfg := dataplane.Config{Frontends: []dataplane.Frontend{
		{Name: "ns/web:http", Address: "fd00:96::1"}, {Name: "ns/web:https", Address: "fd00:96::1"},
		{Name: "ns/dns:dns", Address: "fd00:96::1"}, {Name: "ns/other:http", Address: "10.96.240.1"},
	}}
	owners := map[string]*corev1.Service{"ns/web:http": web, "ns/web:https": web, "ns/dns:dns": dns, "ns/other:http": {}}
	rec := events.NewFakeRecorder(20)
	r := &unannouncedReporter{recorder: rec, node: "lb-1"}
	v6 := netip.MustParseAddr("fd00:96::1")
	steps := []struct {
		name string
		now  map[netip.Addr]string
		want []string // substrings of the events expected, in order
	}{
		{"refused", map[netip.Addr]string{v6: "BGP: IPv6 routes need an IPv6 next hop"}, []string{
			"Warning AddressNotAnnounced ebb lb on node lb-1 serves fd00:96::1 but cannot announce it: BGP: IPv6 routes need an IPv6 next hop",
			"Warning AddressNotAnnounced"}},
		{"same again", map[netip.Addr]string{v6: "BGP: IPv6 routes need an IPv6 next hop"}, nil},
		{"another reason", map[netip.Addr]string{v6: "L2: too many"}, []string{"L2: too many", "L2: too many"}},
		{"announced", nil, []string{"Normal AddressAnnounced ebb lb on node lb-1 announces fd00:96::1 again", "Normal AddressAnnounced"}},
		{"nothing", nil, nil},
	}
	for _, step := range steps {
		r.report(logr.Discard(), step.now, cfg, owners)
		var got []string
		for len(rec.Events) > 0 {
			got = append(got, <-rec.Events)
		}
		if len(got) != len(step.want) {
			t.Fatalf("%s: events %q, want %d", step.name, got, len(step.want))
		}
		for i := range got {
			if !strings.Contains(got[i], step.want[i]) {
				t.Errorf("%s: event %q, want %q in it", step.name, got[i], step.want[i])
			}
		}
	}
}
