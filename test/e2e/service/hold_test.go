package service_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
// with events that say so. Turned off, ebb takes its annotation off every
// node, so that cluster-autoscaler never waits on it.
func TestAutoscalerDeletionHold(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	setHoldFlags := func(ctx context.Context, on bool) error {
		return ebbrun.UpdateControllerArgs(ctx, cluster, func(args []string) []string {
			args = slices.DeleteFunc(args, func(a string) bool {
				return strings.HasPrefix(a, "--autoscaler-deletion-hold") || strings.HasPrefix(a, "--deletion-hold-timeout")
			})
			if on {
				args = append(args, "--autoscaler-deletion-hold", "--deletion-hold-timeout=3m")
			}
			return args
		})
	}
	if err := setHoldFlags(ctx, true); err != nil {
		t.Fatal(err)
	}
	holdOff := false
	defer func() {
		if !holdOff {
			_ = setHoldFlags(context.Background(), false)
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
	for range 12 {
		l, err := e2eutil.OpenLongLived(cluster, nil, addr, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, l)
	}
	// The node that carries the most of them, as the LB reports it: the
	// one the autoscaler scales down.
	api := e2eutil.APIClient(t, cluster)
	var node string
	eventually(t, ctx, 15*time.Second, "the load balancer to report the long-lived connections", func(ctx context.Context) (bool, string) {
		rep, err := e2eutil.ReportOn(ctx, api, lbNode.Name)
		if err != nil {
			return false, err.Error()
		}
		var most int64
		for _, n := range rep.Status.Nodes {
			if n.Connections > most {
				most, node = n.Connections, n.Name
			}
		}
		return most > 0, fmt.Sprintf("%+v", rep.Status.Nodes)
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

	if err := setHoldFlags(ctx, false); err != nil {
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
