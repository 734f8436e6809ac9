package lbsync

import (
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
// interleaved with the new ones, for the overlap, then only the new ones.
func TestModeSwitchOverlap(t *testing.T) {
	now := time.Unix(1000, 0)
	s := &Syncer{modes: map[string]lbmodel.BackendMode{}, last: map[string][]dataplane.Frontend{}, transitions: map[string]transition{}, now: func() time.Time { return now }}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}, Spec: corev1.ServiceSpec{
		AllocateLoadBalancerNodePorts: ptr.To(false), Ports: []corev1.ServicePort{{Port: 80}},
	}}
	pod := []dataplane.Frontend{{Name: "fe", Backends: []dataplane.Backend{{Address: "10.244.1.1", Port: 8080}, {Address: "10.244.2.1", Port: 8080}}}}
	node := []dataplane.Frontend{{Name: "fe", Backends: []dataplane.Backend{{Address: "10.0.0.1", Port: 30080}, {Address: "10.0.0.2", Port: 30080}, {Address: "10.0.0.3", Port: 30080}}}}
	if got := s.overlap(logr.Discard(), svc, "ns/web", pod); !reflect.DeepEqual(got, pod) {
		t.Fatalf("first sight: %+v", got)
	}
	svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(true)
	svc.Spec.Ports[0].NodePort = 30080
	got := s.overlap(logr.Discard(), svc, "ns/web", node)
	want := []dataplane.Backend{node[0].Backends[0], pod[0].Backends[0], node[0].Backends[1], pod[0].Backends[1], node[0].Backends[2]}
	if !reflect.DeepEqual(got[0].Backends, want) {
		t.Fatalf("during the overlap:\n got %+v\nwant %+v", got[0].Backends, want)
	}
	if end, ok := s.nextTransitionEnd(); !ok || !end.Equal(now.Add(modeSwitchOverlap)) {
		t.Errorf("overlap ends %v, %v", end, ok)
	}
	now = now.Add(modeSwitchOverlap)
	if got := s.overlap(logr.Discard(), svc, "ns/web", node); !reflect.DeepEqual(got, node) {
		t.Errorf("after the overlap: %+v", got)
	}
	if _, ok := s.nextTransitionEnd(); ok {
		t.Error("a finished overlap is still pending")
	}
}
