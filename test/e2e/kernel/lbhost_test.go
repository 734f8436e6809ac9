package kernel_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// A NodeMaintenance of an LB host on the eBPF path under traffic drops
// nothing: the host withdraws its route, its ebb lb counts the flows the
// tc program still carries (the maintenance waits for them), the router
// sends those connections to the other LB host, which forwards their
// segments back to the draining one (moved flows: its program has no flow
// for them, the stack's rule sends them on), and the draining host's
// program goes on translating them. Complete brings the host back, and
// the connections the router then moves to it go back to the other host.
func TestMaintainingAnLBHostOnTheEBPFPathDropsNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	lbA := cluster.Nodes[0]
	// The app runs off the maintained host: its pods there would be
	// evicted, which ends their connections whatever the load balancers
	// do, and this test is about the LB host.
	s := deployService(t, ctx, e2eutil.AvoidNode(lbA.Name))
	lbB := s.LBs[1]
	expectEBPF(t, ctx, s)
	c := e2eutil.APIClient(t, cluster)
	e2eutil.WaitNoPodTerminatingOn(t, ctx, cluster, lbA.Name)
	requests := e2eutil.StartRequests(t, ctx, s.Client, s.URL, 2)
	long := e2eutil.StartLongLived(t, ctx, cluster, netip.AddrPortFrom(s.VIP, 80), 12)
	time.Sleep(time.Second)

	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "lb-host-ebpf-" + lbA.Name},
		Spec: v1alpha1.NodeMaintenanceSpec{NodeSelector: e2eutil.NodeByName(lbA.Name), Stage: v1alpha1.Drain, Reason: "e2e: maintain an LB host on the eBPF path",
			TrafficDrainTimeoutSeconds: ptr.To[int32](120)},
	}
	if err := c.Create(ctx, nm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), nm) })
	started := time.Now()
	e2eutil.WaitNextHops(t, ctx, router, s.Route, s.NextHops[1:])
	t.Logf("%s's route withdrawn %s after its maintenance started", lbA.Name, time.Since(started).Round(time.Millisecond))

	// The draining replica counts the flows its program carries, and the
	// maintenance waits for them.
	var report v1alpha1.LoadBalancerReport
	e2eutil.Eventually(t, ctx, 30*time.Second, lbA.Name+"'s ebb lb reporting itself draining with connections left", func(ctx context.Context) (bool, string) {
		r, err := e2eutil.ReportOn(ctx, c, lbA.Name)
		if err != nil {
			return false, err.Error()
		}
		report = r
		return r.Status.Draining && r.Status.Connections > 0, fmt.Sprintf("%+v", r.Status)
	})
	t.Logf("%s's ebb lb reported itself draining with %d connection(s) %s after the maintenance started", lbA.Name, report.Status.Connections, time.Since(started).Round(time.Millisecond))
	e2eutil.WaitDrainMessage(t, ctx, c, nm, lbA.Name, 30*time.Second, "the maintenance waiting for the LB host's own connections", func(got *v1alpha1.NodeMaintenance, msg string) bool {
		return !meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.DrainedCondition) && strings.Contains(msg, "through the node's own ebb lb")
	})
	t.Logf("the maintenance said it waits for them %s after it started", time.Since(started).Round(time.Millisecond))

	// The long-lived connections go on through the other host, which
	// sends their segments back.
	time.Sleep(3 * time.Second)
	e2eutil.ExpectForwarded(t, ctx, cluster, lbB, lbA)
	if n := long.Failed.Load(); n > 0 {
		t.Fatalf("%d of 12 long-lived connections broke while %s drained; first: %v", n, lbA.Name, long.FirstErr.Load())
	}

	// They end: the host is drained. (The time since the maintenance
	// started is mostly this test's own steps above.)
	long.Halt()
	ended := time.Now()
	e2eutil.WaitMaintenanceDrained(t, ctx, c, nm, lbA.Name)
	t.Logf("%s drained %s after its last connections ended, %s after its maintenance started", lbA.Name, time.Since(ended).Round(time.Millisecond), time.Since(started).Round(time.Millisecond))

	// Connections opened while the host is out go through the other one;
	// when the host comes back the router moves some of them to it, and it
	// sends them back.
	late := e2eutil.StartLongLived(t, ctx, cluster, netip.AddrPortFrom(s.VIP, 80), 12)
	time.Sleep(time.Second)
	patch := client.MergeFrom(nm.DeepCopy())
	nm.Spec.Stage = v1alpha1.Complete
	if err := c.Patch(ctx, nm, patch); err != nil {
		t.Fatal(err)
	}
	e2eutil.WaitNextHops(t, ctx, router, s.Route, s.NextHops)
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
	t.Logf("%d requests on new connections, %d on 12 long-lived connections, %d on 12 more opened during the maintenance", requests.OK.Load(), long.OK.Load(), late.OK.Load())
	expectServed(t, requests)
	expectEBPF(t, ctx, s)
}
