package nodemaintenance

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbhost"
)

// Several replicas: a node is Down only when every fresh report says so,
// connections add up over replicas, and a stale report (a replica that is
// gone) does not count.
func TestLoadBalancerViews(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	report := func(name string, age time.Duration, nodes ...v1alpha1.NodeTraffic) client.Object {
		ts := metav1.NewMicroTime(now.Add(-age))
		return &v1alpha1.LoadBalancerReport{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: v1alpha1.LoadBalancerReportStatus{Replica: name, RenewTime: &ts, HeartbeatSeconds: 10, Nodes: nodes}}
	}
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		report("r1", time.Second, v1alpha1.NodeTraffic{Name: "a", AdminState: "Down", Connections: 2}, v1alpha1.NodeTraffic{Name: "b", AdminState: "Down", Connections: 0}),
		report("r2", 5*time.Second, v1alpha1.NodeTraffic{Name: "a", AdminState: "Down", Connections: 3}, v1alpha1.NodeTraffic{Name: "b", AdminState: "None", Connections: 4}),
		report("gone", 5*time.Minute, v1alpha1.NodeTraffic{Name: "a", AdminState: "None", Connections: 100}),
	).Build()
	r := &Reconciler{Client: cl, Clock: clocktesting.NewFakePassiveClock(now)}
	views, err := r.loadBalancerViews(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if v := views("a"); !v.Down || v.Connections != 5 {
		t.Errorf("a: %+v, want Down with 5 connections (the stale report ignored)", v)
	}
	if v := views("b"); v.Down {
		t.Errorf("b: %+v, want not Down (r2 still sends it traffic)", v)
	}
	if v := views("c"); !v.Down || v.Connections != 0 {
		t.Errorf("c (no backends anywhere): %+v", v)
	}

	// An ebb lb pod that runs without a fresh report (issue 42 item 5):
	// what it sends each node is unknown, so no node is Down; before, a
	// missing report counted as "Down, no connection", and evictions
	// started at once.
	if err := cl.Create(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ebb-system", Name: "gone", Labels: map[string]string{"app.kubernetes.io/name": "ebb-lb"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ebb-lb", UID: "ds", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: "x"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}); err != nil {
		t.Fatal(err)
	}
	views, err = r.loadBalancerViews(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"a", "c"} {
		if v := views(node); !slices.Equal(v.Unknown, []string{"gone"}) {
			t.Errorf("%s with an unreported ebb lb pod: %+v, want gone unknown", node, v)
		}
	}
	// A pod with the label that ebb's DaemonSet does not own (anyone who
	// may create pods can label one) is no replica.
	if err := cl.Create(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "fake", Labels: map[string]string{"app.kubernetes.io/name": "ebb-lb"}},
		Spec: corev1.PodSpec{NodeName: "x"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}); err != nil {
		t.Fatal(err)
	}
	if views, err = r.loadBalancerViews(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v := views("a"); !slices.Equal(v.Unknown, []string{"gone"}) {
		t.Errorf("a labelled pod ebb does not own counts as a replica: %+v", v)
	}
}

// An unreported replica holds evacuation back until the gate, and never
// the wait for the connections the reports show: after the gate, a node
// the reports show Down with connections still waits for them (or the
// traffic-drain timeout).
func TestUnreportedReplicaHoldsOnlyEvacuation(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	r := &Reconciler{Clock: clocktesting.NewFakePassiveClock(now)}
	started := metav1.NewTime(now.Add(-10 * time.Second))
	nm := &v1alpha1.NodeMaintenance{Status: v1alpha1.NodeMaintenanceStatus{StageStatuses: []v1alpha1.StageStatus{{Name: v1alpha1.Drain, StartTimestamp: &started}}}}
	view := lbhost.View{Down: true, Connections: 3, Unknown: []string{"ebb-lb-x"}}
	nd := &nodeDrain{}
	r.trafficDrain(nm, "a", view, nd)
	if nd.mayEvacuate || nd.trafficDone || !strings.Contains(trafficMessage(nd), "Waiting for ebb lb ebb-lb-x to report") {
		t.Errorf("within the gate: %+v %q", nd, trafficMessage(nd))
	}
	old := metav1.NewTime(now.Add(-40 * time.Second))
	nm.Status.StageStatuses[0].StartTimestamp = &old
	nd = &nodeDrain{}
	r.trafficDrain(nm, "a", view, nd)
	if !nd.mayEvacuate || nd.trafficDone || (&drainResult{nodes: map[string]*nodeDrain{"a": nd}}).requeueAfter() == time.Second {
		t.Errorf("after the gate: %+v; want evacuation, still waiting for 3 connections, no 1 s requeue", nd)
	}
}

// An LB host: the ebb lb replicas running on a node hold the node up until
// they drain, and their own connections count as the node's traffic.
func TestLoadBalancerViewsOfAnLBHost(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	ts := metav1.NewMicroTime(now.Add(-time.Second))
	hosted := func(name, host string, draining bool, conns int64, nodes ...v1alpha1.NodeTraffic) v1alpha1.LoadBalancerReport {
		return v1alpha1.LoadBalancerReport{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1alpha1.LoadBalancerReportStatus{
			Replica: name, HostNode: host, Draining: draining, Connections: conns, RenewTime: &ts, HeartbeatSeconds: 10, Nodes: nodes}}
	}
	backendA := v1alpha1.NodeTraffic{Name: "a", AdminState: "Down", Connections: 1}
	for _, tc := range []struct {
		name    string
		reports []v1alpha1.LoadBalancerReport
		node    string
		want    lbhost.View
	}{
		{"a serving replica holds its host up", []v1alpha1.LoadBalancerReport{hosted("lb-a", "a", false, 7, backendA)}, "a",
			lbhost.View{Down: false, Connections: 8, HostConnections: 7, HostServing: []string{"lb-a"}}},
		{"a draining replica lets it go, its connections still count", []v1alpha1.LoadBalancerReport{hosted("lb-a", "a", true, 7, backendA)}, "a",
			lbhost.View{Down: true, Connections: 8, HostConnections: 7}},
		{"an old replica (handed over) and the new one on the same host", []v1alpha1.LoadBalancerReport{hosted("old", "a", true, 2), hosted("new", "a", false, 3)}, "a",
			lbhost.View{Down: false, Connections: 5, HostConnections: 5, HostServing: []string{"new"}}},
		{"another host's replica does not count for this node", []v1alpha1.LoadBalancerReport{hosted("lb-b", "b", false, 9, backendA)}, "a",
			lbhost.View{Down: true, Connections: 1}},
		{"a report without a host (an older ebb lb) holds nothing up", []v1alpha1.LoadBalancerReport{hosted("lb", "", false, 9)}, "a",
			lbhost.View{Down: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := lbhost.Views(tc.reports, nil, metav1.NewTime(now))(tc.node)
			if got.Down != tc.want.Down || got.Connections != tc.want.Connections || got.HostConnections != tc.want.HostConnections || !slices.Equal(got.HostServing, tc.want.HostServing) {
				t.Errorf("view of %s = %+v, want %+v", tc.node, got, tc.want)
			}
		})
	}
}

// The traffic drain: evacuation waits for the load balancers (up to the
// gate), and the node's traffic is drained with no connection left or at
// the timeout.
func TestTrafficDrain(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	r := &Reconciler{Clock: clocktesting.NewFakePassiveClock(now)}
	started := metav1.NewTime(now.Add(-10 * time.Second))
	nm := &v1alpha1.NodeMaintenance{Status: v1alpha1.NodeMaintenanceStatus{StageStatuses: []v1alpha1.StageStatus{{Name: v1alpha1.Drain, StartTimestamp: &started}}}}
	nd := &nodeDrain{}
	r.trafficDrain(nm, "a", lbhost.View{Down: false}, nd)
	if nd.mayEvacuate || nd.trafficDone || trafficMessage(nd) != "Waiting for the load balancers to stop sending new connections to the node" {
		t.Errorf("before Down: %+v %q", nd, trafficMessage(nd))
	}
	old := metav1.NewTime(now.Add(-40 * time.Second))
	nm.Status.StageStatuses[0].StartTimestamp = &old
	nd = &nodeDrain{}
	r.trafficDrain(nm, "a", lbhost.View{Down: false}, nd)
	if !nd.mayEvacuate || !nd.lbGateExpired {
		t.Errorf("after the gate: %+v", nd)
	}
	nd = &nodeDrain{}
	r.trafficDrain(nm, "a", lbhost.View{Down: true, Connections: 3}, nd)
	if !nd.mayEvacuate || nd.trafficDone || nd.trafficStart == nil || nd.trafficStart.Time.Before(now) {
		t.Errorf("Down with connections: %+v (the start rounds up to a whole second)", nd)
	}
	nm.Spec.TrafficDrainTimeoutSeconds = new(int32)
	*nm.Spec.TrafficDrainTimeoutSeconds = 5
	nm.Status.NodeStatuses = []v1alpha1.NodeMaintenanceNodeStatus{{NodeRef: v1alpha1.NodeReference{Name: "a"}, TrafficDrainStartTime: &old}}
	nd = &nodeDrain{}
	r.trafficDrain(nm, "a", lbhost.View{Down: true, Connections: 3}, nd)
	if !nd.trafficDone || !nd.trafficTimedOut {
		t.Errorf("after the timeout: %+v", nd)
	}
	nd = &nodeDrain{}
	nm.Spec.TrafficDrainTimeoutSeconds = nil
	r.trafficDrain(nm, "a", lbhost.View{Down: true}, nd)
	if !nd.trafficDone || nd.trafficTimedOut {
		t.Errorf("no connection left: %+v", nd)
	}
}

// While the connections do not change, neither does the message: it names
// the traffic-drain deadline, not the time left, so reconciles a second
// apart write nothing.
func TestTrafficMessageIsStableWhileWaiting(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(now)
	r := &Reconciler{Clock: clk}
	start := metav1.NewTime(now.Add(-10 * time.Second))
	nm := &v1alpha1.NodeMaintenance{Status: v1alpha1.NodeMaintenanceStatus{
		NodeStatuses: []v1alpha1.NodeMaintenanceNodeStatus{{NodeRef: v1alpha1.NodeReference{Name: "a"}, TrafficDrainStartTime: &start}},
	}}
	var msgs []string
	for range 3 {
		nd := &nodeDrain{}
		r.trafficDrain(nm, "a", lbhost.View{Down: true, Connections: 3}, nd)
		msgs = append(msgs, trafficMessage(nd))
		clk.SetTime(clk.Now().Add(1700 * time.Millisecond))
	}
	want := "Waiting for 3 established connection(s) through the load balancers to finish (traffic-drain timeout at 2026-11-22T12:04:50Z)"
	for i, m := range msgs {
		if m != want {
			t.Errorf("reconcile %d: %q, want %q", i, m, want)
		}
	}
}

// The node conditions name the maintenances in a fixed order, whatever
// order the cache lists them in: two lists in different orders publish
// once, not once each.
func TestNodeConditionsDoNotDependOnListOrder(t *testing.T) {
	mk := func(name string) v1alpha1.NodeMaintenance {
		return v1alpha1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain}}
	}
	a, b, c := mk("maint-a"), mk("maint-b"), mk("maint-c")
	orders := [][]v1alpha1.NodeMaintenance{{a, b, c}, {c, a, b}, {b, c, a}}
	var first []string
	for i, order := range orders {
		w := &world{maintenances: order, selected: map[string][]string{"maint-a": {"n"}, "maint-b": {"n"}, "maint-c": {"n"}}}
		got := w.covering("n", "", v1alpha1.Cordon, v1alpha1.Drain)
		if i == 0 {
			first = got
			continue
		}
		if !slices.Equal(got, first) {
			t.Errorf("list order %d: %v, first %v", i, got, first)
		}
	}
	if !slices.Equal(first, []string{"maint-a", "maint-b", "maint-c"}) {
		t.Errorf("covering: %v, want sorted by name", first)
	}
}

// A node whose traffic drain times out is said once, by a Warning and by
// ebb_nodemaintenance_traffic_drain_timeouts_total (the alert
// EbbTrafficDrainTimedOut), not again on the reconciles after the status
// recorded it.
func TestATrafficDrainTimeoutIsCountedOnce(t *testing.T) {
	r, _, rec := newFakeReconciler(t)
	nm := &v1alpha1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Name: "m"},
		Status: v1alpha1.NodeMaintenanceStatus{NodeStatuses: []v1alpha1.NodeMaintenanceNodeStatus{{NodeRef: v1alpha1.NodeReference{Name: "a"}}}}}
	nd := &nodeDrain{lbDown: true, trafficDone: true, trafficTimedOut: true, connections: 3}
	r.reportTraffic(nm, "a", nd)
	if got := testutil.ToFloat64(r.Metrics.trafficTimeouts); got != 1 {
		t.Errorf("counted %v, want 1", got)
	}
	if ev := <-rec.Events; !strings.Contains(ev, v1alpha1.ReasonTrafficDrainTimeout) {
		t.Errorf("event %q, want %s", ev, v1alpha1.ReasonTrafficDrainTimeout)
	}
	nm.Status.NodeStatuses[0].DrainMessage = trafficMessage(nd)
	r.reportTraffic(nm, "a", nd)
	if got := testutil.ToFloat64(r.Metrics.trafficTimeouts); got != 1 {
		t.Errorf("counted %v after the status recorded the timeout, want 1", got)
	}
	select {
	case ev := <-rec.Events:
		t.Errorf("a second event: %q", ev)
	default:
	}
}
