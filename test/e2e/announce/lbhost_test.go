package announce_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// A NodeMaintenance of an LB host under traffic drops nothing: the host's
// ebb lb withdraws its route as soon as the host is tainted (the router
// keeps the other LB host), serves its established connections, and its
// LoadBalancerReport counts them down; the maintenance waits for them
// before it is Drained and says so; draining the other LB host meanwhile
// is refused, since no host would be left for the addresses; Complete
// brings the host back into the route, and the connections the router
// then moves to it are forwarded back to the host that has them.
func TestMaintainingAnLBHostDropsNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	lbA := cluster.Nodes[0]
	// The app runs off the maintained host: its pods there would be
	// evicted with a 5 s grace period, which ends their connections
	// whatever the load balancers do, and this test is about the LB host.
	s := e2eutil.DeployBGPService(t, ctx, cluster, router, e2eutil.AvoidNode(lbA.Name))
	lbB := s.LBs[1]
	vip, route, both, httpClient, url := s.VIP, s.Route, s.NextHops, s.Client, s.URL
	c := e2eutil.APIClient(t, cluster)

	e2eutil.WaitNoPodTerminatingOn(t, ctx, cluster, lbA.Name)
	requests := e2eutil.StartRequests(t, ctx, httpClient, url, 2)
	long := e2eutil.StartLongLived(t, ctx, cluster, netip.AddrPortFrom(vip, 80), 12)
	time.Sleep(time.Second)

	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "lb-host-" + lbA.Name},
		Spec: v1alpha1.NodeMaintenanceSpec{NodeSelector: e2eutil.NodeByName(lbA.Name), Stage: v1alpha1.Drain, Reason: "e2e: maintain an LB host",
			TrafficDrainTimeoutSeconds: ptr.To[int32](120)},
	}
	if err := c.Create(ctx, nm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), nm) })
	started := time.Now()
	waitNextHops(t, ctx, route, both[1:])
	t.Logf("%s's route withdrawn %s after its maintenance started", lbA.Name, time.Since(started).Round(time.Millisecond))

	// The host's own replica drains and counts its connections; the
	// maintenance waits for them and says why.
	var report v1alpha1.LoadBalancerReport
	var err error
	e2eutil.Eventually(t, ctx, 30*time.Second, lbA.Name+"'s ebb lb reporting itself draining with connections left", func(ctx context.Context) (bool, string) {
		r, err := e2eutil.ReportOn(ctx, c, lbA.Name)
		if err != nil {
			return false, err.Error()
		}
		report = r
		return r.Status.Draining && r.Status.Connections > 0, fmt.Sprintf("%+v", r.Status)
	})
	e2eutil.WaitDrainMessage(t, ctx, c, nm, lbA.Name, 30*time.Second, "the maintenance waiting for the LB host's own connections", func(got *v1alpha1.NodeMaintenance, msg string) bool {
		return !meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.DrainedCondition) && strings.Contains(msg, "through the node's own ebb lb")
	})

	// No host would be left for the addresses: refused, with why.
	other := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "lb-host-" + lbB.Name},
		Spec:       v1alpha1.NodeMaintenanceSpec{NodeSelector: e2eutil.NodeByName(lbB.Name), Stage: v1alpha1.Drain, Reason: "e2e: the last LB host"},
	}
	err = c.Create(ctx, other)
	if err == nil {
		_ = c.Delete(context.Background(), other)
		t.Fatal("a maintenance draining the last serving LB host was admitted")
	}
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "would leave no ebb lb serving the load-balancer addresses") {
		t.Fatalf("refusal %v", err)
	}
	t.Logf("refused: %v", err)

	// The long-lived connections through the draining host go on: the
	// router sends them to the other LB host, which forwards them back.
	time.Sleep(3 * time.Second)
	e2eutil.ExpectForwarded(t, ctx, cluster, lbB, lbA)
	if n := long.Failed.Load(); n > 0 {
		t.Fatalf("%d of 12 long-lived connections broke while %s drained; first: %v", n, lbA.Name, long.FirstErr.Load())
	}

	// The long-lived connections end: the host is drained. (The time
	// since the maintenance started is mostly this test's own steps
	// above.)
	long.Halt()
	ended := time.Now()
	e2eutil.WaitMaintenanceDrained(t, ctx, c, nm, lbA.Name)
	t.Logf("%s drained %s after its last connections ended, %s after its maintenance started (its ebb lb had %d connection(s) when it started draining)", lbA.Name, time.Since(ended).Round(time.Millisecond), time.Since(started).Round(time.Millisecond), report.Status.Connections)

	// Connections opened while the host is out go through the other one;
	// when the host comes back the router moves some of them to it, and it
	// forwards them back (it is joining).
	late := e2eutil.StartLongLived(t, ctx, cluster, netip.AddrPortFrom(vip, 80), 12)
	time.Sleep(time.Second)

	// Complete: the host is back in the route.
	patch := client.MergeFrom(nm.DeepCopy())
	nm.Spec.Stage = v1alpha1.Complete
	if err := c.Patch(ctx, nm, patch); err != nil {
		t.Fatal(err)
	}
	waitNextHops(t, ctx, route, both)
	e2eutil.Eventually(t, ctx, 30*time.Second, lbA.Name+"'s ebb lb serving again", func(ctx context.Context) (bool, string) {
		r, err := e2eutil.ReportOn(ctx, c, lbA.Name)
		return err == nil && !r.Status.Draining, fmt.Sprint(r.Status, err)
	})
	time.Sleep(3 * time.Second)
	e2eutil.ExpectForwarded(t, ctx, cluster, lbA, lbB)
	late.Halt()
	requests.Halt()
	if n := late.Failed.Load(); n > 0 {
		t.Errorf("%d of 12 long-lived connections opened during the maintenance broke when %s came back; first: %v", n, lbA.Name, late.FirstErr.Load())
	}
	t.Logf("%d requests on new connections, %d on 12 long-lived connections", requests.OK.Load(), long.OK.Load())
	if n := requests.Failed.Load(); n > 0 {
		t.Errorf("%d of %d requests on new connections failed; first: %v", n, n+requests.OK.Load(), requests.FirstErr.Load())
	}
	if n := long.Failed.Load(); n > 0 {
		t.Errorf("%d of 12 long-lived connections broke; first: %v", n, long.FirstErr.Load())
	}
}
