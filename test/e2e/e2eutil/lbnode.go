package e2eutil

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// StartLB makes node an LB node (the label the ebb lb DaemonSet selects)
// and waits until its ebb lb pod is ready. The returned function takes
// the label away, and the DaemonSet stops the pod (SIGTERM, its grace
// period); it also runs when the test ends.
func StartLB(t *testing.T, ctx context.Context, c *localcluster.Cluster, node localcluster.Node) func() {
	t.Helper()
	label := func(ctx context.Context, lb bool) {
		if err := ebbrun.SetLBNode(ctx, c, node.Name, lb); err != nil {
			t.Fatal(err)
		}
	}
	label(ctx, true)
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			// Also a cleanup: the test's context may be over.
			label(context.Background(), false)
		}
	}
	t.Cleanup(stop)
	Eventually(t, ctx, time.Minute, "ebb lb on "+node.Name+" ready", func(ctx context.Context) (bool, string) {
		body, err := ebbrun.LBPage(ctx, c, node, "/readyz")
		return err == nil, fmt.Sprint(err, body)
	})
	return stop
}
