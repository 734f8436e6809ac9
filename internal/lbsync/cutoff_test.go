package lbsync

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// A replica cut off the API server (CutOff) takes its own node's backend
// out of each frontend where another node can take the new connections,
// resyncing when that starts and when it ends; the gauge says so.
func TestACutOffReplicaSparesItsOwnNode(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(lbmodel.ClassL4),
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "10.96.240.1"}}}},
	}
	node := func(name, ip string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
	}
	svcs, slices, nodes := replicaView(t, []any{svc, node("n1", "10.0.0.1"), node("lb", "10.0.0.9")})
	dp, err := dataplane.New(dataplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dp.Close() })
	var cut atomic.Bool
	s := &Syncer{Class: lbmodel.ClassL4, HostNode: "lb", DataPlane: dp, CutOff: cut.Load,
		modes: map[string]lbmodel.BackendMode{}, last: map[string][]dataplane.Frontend{}, transitions: map[string]transition{},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	t.Cleanup(s.queue.ShutDown)
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "cut_off"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.watchCutOff(ctx, logr.Discard(), gauge)

	ownState := func() dataplane.AdminState {
		cfg, _, _ := s.desired(logr.Discard(), svcs, slices, nodes)
		for _, b := range cfg.Frontends[0].Backends {
			if b.Owner == "lb" {
				return b.AdminState
			}
		}
		t.Fatal("the LB host's own node is no backend")
		return ""
	}
	kicked := func(what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for s.queue.Len() == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("no resync after %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
		key, _ := s.queue.Get()
		s.queue.Done(key)
	}

	if got := ownState(); got != dataplane.AdminNone {
		t.Fatalf("reaching the API: own node %s, want None", got)
	}
	cut.Store(true)
	kicked("the cut")
	if got := ownState(); got != dataplane.AdminDown {
		t.Errorf("cut off: own node %s, want Down", got)
	}
	if v := testutil.ToFloat64(gauge); v != 1 {
		t.Errorf("cut off: gauge %v, want 1", v)
	}
	cut.Store(false)
	kicked("the end of the cut")
	if got := ownState(); got != dataplane.AdminNone {
		t.Errorf("reaching the API again: own node %s, want None", got)
	}
	if v := testutil.ToFloat64(gauge); v != 0 {
		t.Errorf("reaching the API again: gauge %v, want 0", v)
	}
}
