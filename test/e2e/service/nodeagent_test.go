package service_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

// `ebb node-agent`, installed as its DaemonSet, answers /healthz 200 on a
// node's address for a healthy node and 503 once the cluster autoscaler
// taints it for deletion, while /livez stays 200 (KEP-3836).
func TestNodeAgentHealthz(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := cluster.Nodes[2]
	status := func(path string) int { return agentStatus(t, node.Name, path) }
	eventually(t, ctx, 30*time.Second, "/healthz 200 for a healthy node", func(context.Context) (bool, string) {
		code := status("/healthz")
		return code == http.StatusOK, fmt.Sprint(code)
	})
	taint := func(on bool) {
		t.Helper()
		setTaintKey(t, ctx, node.Name, lbmodel.TaintToBeDeleted, "1732233600", on)
	}
	taint(true)
	defer taint(false)
	eventually(t, ctx, 10*time.Second, "/healthz 503 once the autoscaler taints the node", func(context.Context) (bool, string) {
		code := status("/healthz")
		return code == http.StatusServiceUnavailable, fmt.Sprint(code)
	})
	if code := status("/livez"); code != http.StatusOK {
		t.Errorf("/livez: %d, want 200", code)
	}
	taint(false)
	eventually(t, ctx, 10*time.Second, "/healthz 200 again once the taint is gone", func(context.Context) (bool, string) {
		code := status("/healthz")
		return code == http.StatusOK, fmt.Sprint(code)
	})
}
