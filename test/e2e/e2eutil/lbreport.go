package e2eutil

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// ReportOn returns the report of the serving-or-draining ebb lb replica
// that runs on node (the freshest, if several).
func ReportOn(ctx context.Context, c client.Client, node string) (v1alpha1.LoadBalancerReport, error) {
	var list v1alpha1.LoadBalancerReportList
	if err := c.List(ctx, &list); err != nil {
		return v1alpha1.LoadBalancerReport{}, err
	}
	var best v1alpha1.LoadBalancerReport
	for _, r := range list.Items {
		if r.Status.HostNode != node || r.Status.RenewTime == nil {
			continue
		}
		if best.Status.RenewTime == nil || r.Status.RenewTime.After(best.Status.RenewTime.Time) {
			best = r
		}
	}
	if best.Status.RenewTime == nil {
		return best, fmt.Errorf("no LoadBalancerReport names %s as its host", node)
	}
	return best, nil
}

// NodeStatusOf returns the maintenance's status of node.
func NodeStatusOf(nm *v1alpha1.NodeMaintenance, node string) v1alpha1.NodeMaintenanceNodeStatus {
	for _, s := range nm.Status.NodeStatuses {
		if s.NodeRef.Name == node {
			return s
		}
	}
	return v1alpha1.NodeMaintenanceNodeStatus{}
}

// NodeByName selects one node by its name.
func NodeByName(node string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
		{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}
}

// WaitMaintenanceDrained waits up to a minute for nm's Drained condition,
// quoting node's drain message while it waits.
func WaitMaintenanceDrained(t *testing.T, ctx context.Context, c client.Client, nm *v1alpha1.NodeMaintenance, node string) {
	t.Helper()
	WaitDrainMessage(t, ctx, c, nm, node, time.Minute, "the maintenance Drained", func(got *v1alpha1.NodeMaintenance, _ string) bool {
		return meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.DrainedCondition)
	})
}

// WaitDrainMessage waits up to timeout until done accepts nm and node's
// drain message. Each message the drain goes through is logged as it
// comes, with the time since the wait began: when a drain takes long,
// they say what it waited for.
func WaitDrainMessage(t *testing.T, ctx context.Context, c client.Client, nm *v1alpha1.NodeMaintenance, node string, timeout time.Duration, what string, done func(got *v1alpha1.NodeMaintenance, msg string) bool) {
	t.Helper()
	start, last := time.Now(), ""
	Eventually(t, ctx, timeout, what, func(ctx context.Context) (bool, string) {
		got := &v1alpha1.NodeMaintenance{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(nm), got); err != nil {
			return false, err.Error()
		}
		if msg := NodeStatusOf(got, node).DrainMessage; msg != last {
			t.Logf("%s's drain, %s on: %s", node, time.Since(start).Round(100*time.Millisecond), msg)
			last = msg
		}
		return done(got, last), last
	})
}

// ExpectForwarded checks that the ebb lb on by sent segments of from's
// connections, which the router moved to it, back (moved flows), and not
// millions: a few thousand is a test's traffic; two hosts that forwarded
// a segment neither knew to each other without end (a TTL of 0 went round
// to 255) made it 2.9 million.
func ExpectForwarded(t *testing.T, ctx context.Context, c *localcluster.Cluster, by, from localcluster.Node) {
	t.Helper()
	page, err := ebbrun.LBPage(ctx, c, by, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	switch forwarded := Sum(GrepLines(page, `mode="forward"`), "ebb_lb_moved_flow_segments_total"); {
	case forwarded == 0:
		t.Errorf("%s forwarded no segment of %s's connections:\n%s", by.Name, from.Name, GrepLines(page, "ebb_lb_moved_flow"))
	case forwarded > 100_000:
		t.Errorf("%s forwarded %.0f segments of %s's connections: a forwarding loop", by.Name, forwarded, from.Name)
	default:
		t.Logf("%s forwarded %.0f segments of connections moved from %s", by.Name, forwarded, from.Name)
	}
}

// WaitNoPodTerminatingOn waits until no pod on node is terminating (an
// earlier test's pods, their namespace being deleted, may still be going
// away there): a maintenance of the node then has nothing of another
// test's to wait for while it evacuates.
func WaitNoPodTerminatingOn(t *testing.T, ctx context.Context, c *localcluster.Cluster, node string) {
	t.Helper()
	waitNoPodTerminating(t, ctx, c, time.Minute, "no pod terminating on "+node, "", metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
}

// waitNoPodTerminating waits up to timeout until none of the pods that
// namespace ("": all) and opts list is terminating.
func waitNoPodTerminating(t *testing.T, ctx context.Context, c *localcluster.Cluster, timeout time.Duration, what, namespace string, opts metav1.ListOptions) {
	t.Helper()
	Eventually(t, ctx, timeout, what, func(ctx context.Context) (bool, string) {
		pods, err := c.Client.CoreV1().Pods(namespace).List(ctx, opts)
		if err != nil {
			return false, err.Error()
		}
		var going []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				going = append(going, p.Namespace+"/"+p.Name+" on "+p.Spec.NodeName)
			}
		}
		return len(going) == 0, fmt.Sprint("terminating: ", going)
	})
}
