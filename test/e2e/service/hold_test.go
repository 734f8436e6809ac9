package service_test

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ebbdev/ebb/internal/controller/deletionhold"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// cluster-autoscaler's deletion hold (issue 49), with the controller
// started as a user turns it on: every node in rotation carries ebb's
// delay-deletion annotation; a node tainted ToBeDeletedByClusterAutoscaler
// keeps it while long-lived connections go through it, and loses it soon
// after they end (the moment cluster-autoscaler may delete the instance),
// with events that say so; with connections that never end, it goes at
// --deletion-hold-timeout with a Warning. Turned off, ebb takes its
// annotation off every node, so that cluster-autoscaler never waits on it.
func TestAutoscalerDeletionHold(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	setHoldFlags := func(ctx context.Context, timeout string) error {
		return ebbrun.UpdateControllerArgs(ctx, cluster, func(args []string) []string {
			args = slices.DeleteFunc(args, func(a string) bool {
				return strings.HasPrefix(a, "--autoscaler-deletion-hold") || strings.HasPrefix(a, "--deletion-hold-timeout")
			})
			if timeout != "" {
				args = append(args, "--autoscaler-deletion-hold", "--deletion-hold-timeout="+timeout)
			}
			return args
		})
	}
	if err := setHoldFlags(ctx, "3m"); err != nil {
		t.Fatal(err)
	}
	holdOff := false
	defer func() {
		if !holdOff {
			_ = setHoldFlags(context.Background(), "")
		}
	}()
	for _, n := range appNodes() {
		eventually(t, ctx, 30*time.Second, n.Name+" to be held", func(ctx context.Context) (bool, string) {
			return held(t, ctx, n.Name), "no annotation " + deletionhold.Annotation
		})
	}

	ns := newNamespace(t, ctx)
	addr := net.JoinHostPort(exposeApp(t, ctx, ns, "held", 3), "80")
	var conns []*loadgen.LongLived
	defer func() {
		for _, l := range conns {
			l.Close()
		}
	}()
	conns = append(conns, openLongLived(t, addr, 12)...)
	// The node that carries the most of them, as the LB reports it: the
	// one the autoscaler scales down.
	api := e2eutil.APIClient(t, cluster)
	var node string
	eventually(t, ctx, 15*time.Second, "the load balancer to report the long-lived connections", func(ctx context.Context) (bool, string) {
		conns, err := reportedConnections(ctx, api)
		var most int64
		for _, name := range slices.Sorted(maps.Keys(conns)) {
			if conns[name] > most {
				most, node = conns[name], name
			}
		}
		return most > 0, fmt.Sprintf("%v %v", conns, err)
	})
	heldEvents, releasedEvents := nodeEvents(t, ctx, node, deletionhold.ReasonHeld), nodeEvents(t, ctx, node, deletionhold.ReasonReleased)

	// cluster-autoscaler's first step: the taint, valued with the time.
	setTaintKey(t, ctx, node, lbmodel.TaintToBeDeleted, strconv.FormatInt(time.Now().Unix(), 10), true)
	defer setTaintKey(t, context.Background(), node, lbmodel.TaintToBeDeleted, "", false)
	eventually(t, ctx, 10*time.Second, node+" Down and the hold announced", func(ctx context.Context) (bool, string) {
		down, evs := adminDown(t, node), nodeEvents(t, ctx, node, deletionhold.ReasonHeld)-heldEvents
		return down && evs == 1, fmt.Sprintf("Down %v, %d %s events", down, evs, deletionhold.ReasonHeld)
	})
	time.Sleep(5 * time.Second)
	if !held(t, ctx, node) {
		t.Fatalf("the hold of %s went while its connections remain", node)
	}
	closedAt := time.Now()
	for _, l := range conns {
		if why := l.Broken(); why != "" {
			t.Errorf("a long-lived connection broke while %s was held: %s", node, why)
		}
		l.Close()
	}
	conns = nil
	eventually(t, ctx, 20*time.Second, "the hold of "+node+" to be released", func(ctx context.Context) (bool, string) {
		return !held(t, ctx, node) && nodeEvents(t, ctx, node, deletionhold.ReasonReleased) == releasedEvents+1, "still held"
	})
	t.Logf("%s released %s after its last connection closed", node, time.Since(closedAt).Round(100*time.Millisecond))

	// The autoscaler gave up (the taint removed): back in rotation, held.
	setTaintKey(t, ctx, node, lbmodel.TaintToBeDeleted, "", false)
	eventually(t, ctx, 15*time.Second, node+" held again", func(ctx context.Context) (bool, string) {
		return held(t, ctx, node), "not held"
	})

	// A hold does not outlast its timeout: connections that never end
	// release it at --deletion-hold-timeout, with a Warning, and are not
	// cut by ebb (the instance's deletion will).
	if err := setHoldFlags(ctx, "15s"); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 30*time.Second, node+" held by the restarted controller", func(ctx context.Context) (bool, string) {
		return held(t, ctx, node), "not held"
	})
	conns = append(conns, openLongLived(t, addr, 6)...)
	eventually(t, ctx, 15*time.Second, "the load balancer to report connections through "+node, func(ctx context.Context) (bool, string) {
		conns, err := reportedConnections(ctx, api)
		return conns[node] > 0, fmt.Sprintf("%v %v", conns, err)
	})
	timedOut := nodeEvents(t, ctx, node, deletionhold.ReasonHoldTimedOut)
	taintedAt := time.Now()
	setTaintKey(t, ctx, node, lbmodel.TaintToBeDeleted, strconv.FormatInt(taintedAt.Unix(), 10), true)
	time.Sleep(5 * time.Second)
	if !held(t, ctx, node) {
		t.Fatalf("the hold of %s went 5 s into a 15 s timeout, with connections through it", node)
	}
	eventually(t, ctx, 40*time.Second, "the hold of "+node+" to time out", func(ctx context.Context) (bool, string) {
		return !held(t, ctx, node) && nodeEvents(t, ctx, node, deletionhold.ReasonHoldTimedOut) == timedOut+1, "still held, or no Warning " + deletionhold.ReasonHoldTimedOut
	})
	if after := time.Since(taintedAt); after < 15*time.Second {
		t.Errorf("the hold timed out %s after the taint, before its 15 s", after.Round(100*time.Millisecond))
	}
	t.Logf("%s released by the timeout %s after the taint", node, time.Since(taintedAt).Round(100*time.Millisecond))
	for _, l := range conns {
		if why := l.Broken(); why != "" {
			t.Errorf("a long-lived connection broke when the hold of %s timed out: %s", node, why)
		}
		l.Close()
	}
	conns = nil
	setTaintKey(t, ctx, node, lbmodel.TaintToBeDeleted, "", false)

	if err := setHoldFlags(ctx, ""); err != nil {
		t.Fatal(err)
	}
	holdOff = true
	for _, n := range appNodes() {
		eventually(t, ctx, 30*time.Second, n.Name+"'s hold to be removed once the hold is off", func(ctx context.Context) (bool, string) {
			return !held(t, ctx, n.Name), "still held"
		})
	}
}

// held reports whether a node carries ebb's deletion hold.
func held(t *testing.T, ctx context.Context, name string) bool {
	t.Helper()
	n, err := cluster.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, ok := n.Annotations[deletionhold.Annotation]
	return ok
}

// openLongLived opens n long-lived connections to addr from the client.
func openLongLived(t *testing.T, addr string, n int) []*loadgen.LongLived {
	t.Helper()
	var out []*loadgen.LongLived
	for range n {
		l, err := e2eutil.OpenLongLived(cluster, nil, addr, 200*time.Millisecond)
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

// reportedConnections returns the connections the LB node's ebb lb
// reports through each node.
func reportedConnections(ctx context.Context, api client.Client) (map[string]int64, error) {
	rep, err := e2eutil.ReportOn(ctx, api, lbNode.Name)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, n := range rep.Status.Nodes {
		out[n.Name] = n.Connections
	}
	return out, nil
}
