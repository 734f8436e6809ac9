package service_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

// `ebb node-agent` answers /healthz 200 for a healthy node and 503 once the
// cluster autoscaler taints it for deletion, while /livez stays 200
// (KEP-3836).
func TestNodeAgentHealthz(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := cluster.Nodes[2].Name
	stop, err := cluster.StartProcess("ebb-node-agent", os.Getenv("EBB_BIN"), "node-agent", "--kubeconfig", cluster.Kubeconfig,
		"--node-name", node, "--bind-address", "127.0.0.1:20256", "--metrics-bind-address", "127.0.0.1:29465")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stop() }()
	status := func(path string) int {
		resp, err := http.Get("http://127.0.0.1:20256" + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	eventually(t, ctx, 30*time.Second, "/healthz 200 for a healthy node", func(context.Context) (bool, string) {
		code := status("/healthz")
		return code == http.StatusOK, fmt.Sprint(code)
	})
	taint := func(on bool) {
		t.Helper()
		setTaintKey(t, ctx, node, lbmodel.TaintToBeDeleted, "1732233600", on)
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
