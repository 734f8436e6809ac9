package lbsync

import (
	"context"
	"net/netip"
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

func cutOffService(mutate ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(lbmodel.ClassL4),
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "10.96.240.1"}}}},
	}
	for _, m := range mutate {
		m(s)
	}
	return s
}

func TestSpareOwnNode(t *testing.T) {
	fe := func(states ...dataplane.AdminState) dataplane.Frontend {
		return dataplane.Frontend{Name: "fe", Backends: []dataplane.Backend{
			{Address: "10.0.0.1", Port: 30080, Owner: "n1", AdminState: states[0]},
			{Address: "10.0.0.9", Port: 30080, Owner: "lb", AdminState: states[1]},
		}}
	}
	none, down := dataplane.AdminNone, dataplane.AdminDown
	n1Works := map[backendRef]bool{{"fe", netip.MustParseAddrPort("10.0.0.1:30080")}: true}
	for _, c := range []struct {
		name    string
		svc     *corev1.Service
		fe      dataplane.Frontend
		working map[backendRef]bool
		want    dataplane.AdminState
	}{
		{"another node proven working takes the new connections", cutOffService(), fe(none, none), n1Works, down},
		{"another node not proven working: the own node stays", cutOffService(), fe(none, none), nil, none},
		{"another node Down: the own node stays", cutOffService(), fe(down, none), n1Works, none},
		{"externalTrafficPolicy Local: its node port forwards to its own pods only", cutOffService(func(s *corev1.Service) {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}), fe(none, none), n1Works, none},
		{"pod mode: the backends are pods, not node ports", cutOffService(func(s *corev1.Service) {
			s.Annotations = map[string]string{lbmodel.BackendModeAnnotation: string(lbmodel.PodMode)}
		}), fe(none, none), n1Works, none},
	} {
		t.Run(c.name, func(t *testing.T) {
			was := c.fe.Backends[1].AdminState
			fes := []dataplane.Frontend{c.fe}
			spareOwnNode(c.svc, fes, "lb", func() map[backendRef]bool { return c.working })
			if got := fes[0].Backends[1].AdminState; got != c.want {
				t.Errorf("own node %s, want %s", got, c.want)
			}
			if c.fe.Backends[1].AdminState != was {
				t.Error("the backends lbmodel returned were changed in place")
			}
		})
	}
}

// A replica cut off the API server (CutOff) takes its own node's backend
// out where another node can take the new connections, resyncing when
// that starts and once CutOffHold has passed since it ended; the gauge
// says so.
func TestACutOffReplicaSparesItsOwnNode(t *testing.T) {
	node := func(name, ip string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
	}
	svcs, slices, nodes := replicaView(t, []any{cutOffService(), node("n1", "10.0.0.1"), node("lb", "10.0.0.9")})
	dp, err := dataplane.New(dataplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dp.Close() })
	var cut atomic.Bool
	s := &Syncer{Class: lbmodel.ClassL4, HostNode: "lb", DataPlane: dp, CutOff: cut.Load, CutOffHold: 2 * time.Second,
		modes: map[string]lbmodel.BackendMode{}, last: map[string][]dataplane.Frontend{}, transitions: map[string]transition{},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	t.Cleanup(s.queue.ShutDown)
	first, _, _ := s.desired(logr.Discard(), svcs, slices, nodes)
	s.status = func() []dataplane.BackendStatus { // n1 answers its probes
		return []dataplane.BackendStatus{{Frontend: first.Frontends[0].Name, Address: netip.MustParseAddrPort("10.0.0.1:30080"), Confirmed: true, Healthy: true, Eligible: true}}
	}
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
	kicked := func(what string, within time.Duration) time.Time {
		t.Helper()
		deadline := time.Now().Add(within)
		for s.queue.Len() == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("no resync within %s after %s", within, what)
			}
			time.Sleep(10 * time.Millisecond)
		}
		key, _ := s.queue.Get()
		s.queue.Done(key)
		return time.Now()
	}

	if got := ownState(); got != dataplane.AdminNone {
		t.Fatalf("reaching the API: own node %s, want None", got)
	}
	cut.Store(true)
	kicked("the cut", 3*time.Second)
	if got := ownState(); got != dataplane.AdminDown {
		t.Errorf("cut off: own node %s, want Down", got)
	}
	if v := testutil.ToFloat64(gauge); v != 1 {
		t.Errorf("cut off: gauge %v, want 1", v)
	}
	// The fast path puts its hold back (a retry, a Node event): dropped.
	if _, err := dp.SetOwnerAdminState("lb", dataplane.AdminNone); err != nil {
		t.Fatal(err)
	}
	kicked("the fast path's hold", 3*time.Second)
	if dp.ForgetOwnerAdminState("lb") {
		t.Error("the fast path's hold on the own node was kept while cut off")
	}

	cut.Store(false)
	reached := time.Now()
	at := kicked("the end of the cut", 6*time.Second)
	if held := at.Sub(reached); held < 2*time.Second {
		t.Errorf("the own node came back %s after the first report written, want CutOffHold (2s) or more", held)
	}
	if got := ownState(); got != dataplane.AdminNone {
		t.Errorf("reaching the API again: own node %s, want None", got)
	}
	if v := testutil.ToFloat64(gauge); v != 0 {
		t.Errorf("reaching the API again: gauge %v, want 0", v)
	}
}
