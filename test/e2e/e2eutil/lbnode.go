package e2eutil

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// LBMetricsAddress is where an installed ebb lb serves /metrics and /readyz
// on its host's loopback (config/lb).
const LBMetricsAddress = "127.0.0.1:9464"

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
		body, err := LBPage(ctx, c, node, "/readyz")
		return err == nil, fmt.Sprint(err, body)
	})
	return stop
}

// LBPage gets a page of the ebb lb on node's host.
func LBPage(ctx context.Context, c *localcluster.Cluster, node localcluster.Node, path string) (string, error) {
	h, ok := c.Network.Host(node.Name)
	if !ok {
		return "", fmt.Errorf("no host %s", node.Name)
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return h.DialContext(ctx, network, LBMetricsAddress)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+LBMetricsAddress+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("GET %s on %s: status %d", path, node.Name, resp.StatusCode)
	}
	return string(body), nil
}
