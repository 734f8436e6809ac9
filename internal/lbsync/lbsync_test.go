package lbsync

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// A Service switching between pod and node mode keeps its old backends,
// interleaved with the new ones, for at least the minimum and until the
// data plane has reached one of the new backends of every frontend (a
// probe succeeded), then only the new ones; a new mode that never works
// ends the overlap at the cap.
func TestModeSwitchOverlap(t *testing.T) {
	now := time.Unix(1000, 0)
	var status []dataplane.BackendStatus
	working := func() map[backendRef]bool { return backendsWhere(status, provenWorking) }
	newSyncer := func() *Syncer {
		return &Syncer{modes: map[string]lbmodel.BackendMode{}, last: map[string][]dataplane.Frontend{}, transitions: map[string]transition{},
			now: func() time.Time { return now }}
	}
	podMode := func() *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}, Spec: corev1.ServiceSpec{
			AllocateLoadBalancerNodePorts: ptr.To(false), Ports: []corev1.ServicePort{{Port: 80}},
		}}
	}
	toNodeMode := func(svc *corev1.Service) {
		svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(true)
		svc.Spec.Ports[0].NodePort = 30080
	}
	pod := []dataplane.Frontend{{Name: "fe", Backends: []dataplane.Backend{{Address: "10.244.1.1", Port: 8080}, {Address: "10.244.2.1", Port: 8080}}}}
	node := []dataplane.Frontend{{Name: "fe", Backends: []dataplane.Backend{{Address: "10.0.0.1", Port: 30080}, {Address: "10.0.0.2", Port: 30080}, {Address: "10.0.0.3", Port: 30080}}}}
	merged := []dataplane.Backend{node[0].Backends[0], pod[0].Backends[0], node[0].Backends[1], pod[0].Backends[1], node[0].Backends[2]}
	backend := func(addr string, confirmed, healthy bool) dataplane.BackendStatus {
		return dataplane.BackendStatus{Frontend: "fe", Address: netip.MustParseAddrPort(addr), Confirmed: confirmed, Healthy: healthy, Eligible: true}
	}

	s, svc := newSyncer(), podMode()
	if got := s.overlap(logr.Discard(), svc, "ns/web", pod, working); !reflect.DeepEqual(got, pod) {
		t.Fatalf("first sight: %+v", got)
	}
	toNodeMode(svc)
	switched := now
	for _, tc := range []struct {
		what   string
		status []dataplane.BackendStatus
		after  time.Duration
		want   []dataplane.Backend
	}{
		{"the switch", nil, 0, merged},
		{"a new backend reached before the minimum", []dataplane.BackendStatus{backend("10.0.0.2:30080", true, true)}, modeSwitchMinOverlap - time.Millisecond, merged},
		{"new backends configured, not yet probed", []dataplane.BackendStatus{backend("10.0.0.1:30080", false, true), backend("10.244.1.1:8080", true, true)}, 10 * time.Second, merged},
		{"a new backend reached but failing", []dataplane.BackendStatus{backend("10.0.0.1:30080", true, false)}, 10 * time.Second, merged},
		{"a new backend answered its probe", []dataplane.BackendStatus{backend("10.0.0.2:30080", true, true)}, 0, node[0].Backends},
	} {
		status, now = tc.status, now.Add(tc.after)
		got := s.overlap(logr.Discard(), svc, "ns/web", node, working)
		if !reflect.DeepEqual(got[0].Backends, tc.want) {
			t.Fatalf("%s:\n got %+v\nwant %+v", tc.what, got[0].Backends, tc.want)
		}
		wantCheck := now.Add(modeSwitchCheck)
		if minimum := switched.Add(modeSwitchMinOverlap); now.Before(minimum) {
			wantCheck = minimum // first look at the minimum
		}
		if at, ok := s.nextTransitionCheck(); ok != !reflect.DeepEqual(tc.want, node[0].Backends) || ok && !at.Equal(wantCheck) {
			t.Errorf("%s: next check %v, %v; want %v", tc.what, at, ok, wantCheck)
		}
	}

	// A new mode that never works: the old backends go at the cap.
	s, svc, status = newSyncer(), podMode(), nil
	s.overlap(logr.Discard(), svc, "ns/web", pod, working)
	toNodeMode(svc)
	if got := s.overlap(logr.Discard(), svc, "ns/web", node, working); !reflect.DeepEqual(got[0].Backends, merged) {
		t.Fatalf("the switch: %+v", got[0].Backends)
	}
	now = now.Add(modeSwitchMaxOverlap - time.Millisecond)
	if at, _ := s.nextTransitionCheck(); !at.Equal(now.Add(time.Millisecond)) {
		t.Errorf("last check %v, want the cap", at)
	}
	now = now.Add(time.Millisecond)
	if got := s.overlap(logr.Discard(), svc, "ns/web", node, working); !reflect.DeepEqual(got, node) {
		t.Errorf("after the cap: %+v", got)
	}
	if _, ok := s.nextTransitionCheck(); ok {
		t.Error("a finished overlap is still pending")
	}
}
