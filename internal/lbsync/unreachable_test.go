package lbsync

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/dataplane"
)

// A pod-mode Service none of whose pods answers the probes gets one
// Warning, and one Normal event once a pod answers again; node-mode and
// unprobed frontends are not judged.
func TestUnreachablePodBackendsAreReportedOnce(t *testing.T) {
	rec := events.NewFakeRecorder(10)
	r := newUnreachableReporter(rec)
	podSvc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "direct"}, Spec: corev1.ServiceSpec{AllocateLoadBalancerNodePorts: ptr.To(false), Ports: []corev1.ServicePort{{Port: 80}}}}
	nodeSvc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "nodes"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{NodePort: 30080}}}}
	tcp := &dataplane.HealthCheck{Protocol: dataplane.ProbeTCP}
	cfg := dataplane.Config{Frontends: []dataplane.Frontend{
		{Name: "direct-http", HealthCheck: tcp, Backends: []dataplane.Backend{{Address: "10.244.1.5", Port: 8080}, {Address: "10.244.2.5", Port: 8080}}},
		{Name: "direct-udp", Backends: []dataplane.Backend{{Address: "10.244.1.5", Port: 8081}}},
		{Name: "nodes-http", HealthCheck: tcp, Backends: []dataplane.Backend{{Address: "10.0.0.1", Port: 30080}}},
	}}
	r.expect(cfg, map[string]*corev1.Service{"direct-http": podSvc, "direct-udp": podSvc, "nodes-http": nodeSvc})
	status := func(healthy ...bool) []dataplane.BackendStatus {
		return []dataplane.BackendStatus{
			{Frontend: "direct-http", Address: netip.MustParseAddrPort("10.244.1.5:8080"), Healthy: healthy[0]},
			{Frontend: "direct-http", Address: netip.MustParseAddrPort("10.244.2.5:8080"), Healthy: healthy[1]},
			{Frontend: "direct-udp", Address: netip.MustParseAddrPort("10.244.1.5:8081"), Healthy: true},
			{Frontend: "nodes-http", Address: netip.MustParseAddrPort("10.0.0.1:30080"), Healthy: false},
		}
	}
	for _, tc := range []struct {
		what    string
		healthy []bool
		want    string // event prefix, "" for none
	}{
		{"all reachable", []bool{true, true}, ""},
		{"one down", []bool{false, true}, ""},
		{"none reachable", []bool{false, false}, "Warning " + ReasonPodBackendsUnreachable},
		{"still none", []bool{false, false}, ""},
		{"one back", []bool{true, false}, "Normal " + ReasonPodBackendsReachable},
	} {
		r.check(logr.Discard(), status(tc.healthy...))
		var got string
		select {
		case got = <-rec.Events:
		default:
		}
		if !strings.HasPrefix(got, tc.want) || tc.want == "" && got != "" {
			t.Errorf("%s: event %q, want %q", tc.what, got, tc.want)
		}
		if strings.Contains(got, "Warning") && !strings.Contains(got, "pod network") {
			t.Errorf("%s: the warning %q does not say what to check", tc.what, got)
		}
	}
}
