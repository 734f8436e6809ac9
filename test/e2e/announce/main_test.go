// Package announce_test checks that load-balancer addresses reach the
// ebb lb hosts on a real network: ebb is installed from dist/install.yaml
// with the ebb lb DaemonSet announcing by BGP (the flags a user adds to
// it), and FRR on the router spreads a client's flows across the LB hosts
// (ECMP).
package announce_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

var (
	cluster *localcluster.Cluster
	router  *localcluster.BGPRouter
)

// holdTime is the BGP hold time of the router and the speakers: the least
// FRR accepts, so that a vanished host's routes go within 3 s.
const holdTime = 3 * time.Second

// lbMetricsAddress is where ebb lb serves /metrics and /readyz on its
// host's loopback (config/lb).
const lbMetricsAddress = "127.0.0.1:9464"

func TestMain(m *testing.M) {
	dist := e2eutil.DistDir()
	opts := localcluster.Options{Name: "e2e-announce", Nodes: 3, Images: []string{filepath.Join(dist, "oci")}}
	os.Exit(localcluster.RunTests(m, opts, &cluster, func(c *localcluster.Cluster) (func(), error) { return setUp(c, dist) }))
}

// setUp installs ebb with BGP announcement on ebb lb and no LB node yet
// (tests label theirs), removes the router's static route to the VIP pool
// (BGP is the only way there) and starts FRR on the router.
func setUp(c *localcluster.Cluster, dist string) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bgp := []string{"--bgp-asn", fmt.Sprint(localcluster.LBASN), "--bgp-peer", fmt.Sprintf("%s:%d", localcluster.RouterIP, localcluster.RouterASN), "--bgp-hold-time", holdTime.String()}
	if err := ebbrun.InstallManifest(ctx, c, filepath.Join(dist, "install.yaml"), ebbrun.ManifestOptions{LBArgs: bgp}); err != nil {
		return nil, err
	}
	if err := c.Router.DeleteRoute(localcluster.VIPPrefix); err != nil {
		return nil, err
	}
	var err error
	if router, err = c.StartBGPRouter(ctx, holdTime); err != nil {
		return nil, err
	}
	return router.Stop, nil
}

// startLB makes node an LB node (the label the DaemonSet selects) and waits
// until its ebb lb pod is ready. The returned function takes the label
// away, and the DaemonSet stops the pod (SIGTERM, its grace period).
func startLB(t *testing.T, ctx context.Context, node localcluster.Node) func() {
	t.Helper()
	label := func(ctx context.Context, value *string) {
		v := "null"
		if value != nil {
			v = fmt.Sprintf("%q", *value)
		}
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, ebbrun.LBNodeLabel, v)
		if _, err := cluster.Client.CoreV1().Nodes().Patch(ctx, node.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("labelling %s: %v", node.Name, err)
		}
	}
	on := "true"
	label(ctx, &on)
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			// Also a cleanup: the test's context may be over.
			label(context.Background(), nil)
		}
	}
	t.Cleanup(stop)
	e2eutil.Eventually(t, ctx, time.Minute, "ebb lb on "+node.Name+" ready", func(ctx context.Context) (bool, string) {
		body, err := lbPage(ctx, node, "/readyz")
		return err == nil, fmt.Sprint(err, body)
	})
	return stop
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
