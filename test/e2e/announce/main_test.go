// Package announce_test checks that load-balancer addresses reach the
// ebb lb hosts on a real network: ebb lb runs on two node hosts and
// announces the addresses it serves by BGP to FRR on the router, which
// spreads a client's flows across both (ECMP).
package announce_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	clustercmd "github.com/ebbdev/ebb/internal/cmd/cluster"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

var (
	cluster *localcluster.Cluster
	router  *localcluster.BGPRouter
)

// holdTime is the BGP hold time of the router and the speakers: the least
// FRR accepts, so that a vanished host's routes go within 3 s.
const holdTime = 3 * time.Second

// lbMetricsAddress is where each ebb lb serves /metrics and /readyz, on its
// own host's loopback.
const lbMetricsAddress = "127.0.0.1:19464"

func TestMain(m *testing.M) {
	os.Exit(localcluster.RunTests(m, localcluster.Options{Name: "e2e-announce", Nodes: 3}, &cluster, setUp))
}

// setUp runs the controller, FRR on the router (without the static route to
// the VIP pool: BGP is the only way there) and nothing else; tests start
// their ebb lb replicas.
func setUp(c *localcluster.Cluster) (func(), error) {
	bin := os.Getenv("EBB_BIN")
	if bin == "" {
		return nil, errors.New("EBB_BIN is not set: run the end-to-end tests with `make test` (it builds bin/ebb)")
	}
	stopController, err := clustercmd.StartController(c, bin)
	if err != nil {
		return nil, err
	}
	if err := c.Router.DeleteRoute(localcluster.VIPPrefix); err != nil {
		stopController()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if router, err = c.StartBGPRouter(ctx, holdTime); err != nil {
		stopController()
		return nil, err
	}
	return func() {
		router.Stop()
		stopController()
	}, nil
}

// startLB runs ebb lb on a node's host, announcing by BGP, and waits until
// it is ready. The returned function stops it (SIGTERM).
func startLB(t *testing.T, ctx context.Context, node localcluster.Node) func() {
	t.Helper()
	stop, err := cluster.StartProcessOn(node.Name, "ebb-lb-"+node.Name, os.Getenv("EBB_BIN"), "lb",
		"--kubeconfig", cluster.Kubeconfig, "--metrics-bind-address", lbMetricsAddress, "--report-name", "lb-"+node.Name,
		"--bgp-asn", fmt.Sprint(localcluster.LBASN), "--bgp-peer", fmt.Sprintf("%s:%d", localcluster.RouterIP, localcluster.RouterASN),
		"--bgp-router-id", node.IP, "--bgp-hold-time", holdTime.String())
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	stopOnce := func() {
		if !stopped {
			stopped = true
			if err := stop(); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(stopOnce)
	e2eutil.Eventually(t, ctx, time.Minute, "ebb lb on "+node.Name+" ready", func(ctx context.Context) (bool, string) {
		body, err := lbPage(ctx, node, "/readyz")
		return err == nil, fmt.Sprint(err, body)
	})
	return stopOnce
}

// lbPage gets a page of the ebb lb on node's host.
func lbPage(ctx context.Context, node localcluster.Node, path string) (string, error) {
	h, ok := cluster.Network.Host(node.Name)
	if !ok {
		return "", fmt.Errorf("no host %s", node.Name)
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return h.DialContext(ctx, network, lbMetricsAddress)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+lbMetricsAddress+path, nil)
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
