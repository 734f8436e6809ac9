package ebbrun

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/ebbdev/ebb/internal/localcluster"
)

// Addresses, inside the cluster's namespace, where StartEbb's components
// serve their metrics (and the load balancer its /readyz).
const (
	ControllerMetricsAddress = "127.0.0.1:18080"
	controllerHealthAddress  = "127.0.0.1:18081"
	LBMetricsAddress         = "127.0.0.1:19464"
)

// StartEbb runs `ebb controller` and `ebb lb` of the ebb binary bin against
// a local cluster, as processes in its namespace (logs in the cluster's
// logs/), waits until both are ready, and returns a function that stops
// them. lbArgs are added to ebb lb's flags.
func StartEbb(c *localcluster.Cluster, bin string, lbArgs ...string) (func(), error) {
	stopController, err := StartController(c, bin)
	if err != nil {
		return nil, err
	}
	stopLB, err := StartLB(c, bin, lbArgs...)
	if err != nil {
		stopController()
		return nil, err
	}
	return func() {
		stopLB()
		stopController()
	}, nil
}

// StartController installs ebb's API (CRDs, webhook configurations) and
// runs `ebb controller` (with extra flags args) with its webhooks on
// WebhookAddress; it returns once the controller is ready.
func StartController(c *localcluster.Cluster, bin string, args ...string) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := InstallAPI(ctx, c); err != nil {
		return nil, fmt.Errorf("installing ebb's API: %w", err)
	}
	host, port, _ := strings.Cut(WebhookAddress, ":")
	stop, err := c.StartProcess("ebb-controller", bin, append([]string{"controller", "--kubeconfig", c.Kubeconfig,
		"--vip-pool", localcluster.VIPCIDR.String(), "--vip-pool", localcluster.VIPCIDRv6.String(), "--leader-elect=false", "--kube-api-qps", "200", "--kube-api-burst", "400",
		"--metrics-bind-address", ControllerMetricsAddress, "--health-probe-bind-address", controllerHealthAddress,
		"--webhook-port", port, "--webhook-bind-host", host, "--webhook-ip-address", host,
		"--webhook-cert-dir", filepath.Join(c.Dir(), "webhook-certs")}, args...)...)
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, controllerHealthAddress); err != nil {
		_ = stop()
		return nil, fmt.Errorf("ebb controller did not become ready (logs in %s): %w", filepath.Join(c.Dir(), "logs"), err)
	}
	return func() { _ = stop() }, nil
}

// StartLB runs `ebb lb` (with extra flags args) and returns once it has
// applied its first configuration.
func StartLB(c *localcluster.Cluster, bin string, args ...string) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stop, err := c.StartProcess("ebb-lb", bin, append([]string{"lb", "--kubeconfig", c.Kubeconfig, "--metrics-bind-address", LBMetricsAddress}, args...)...)
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, LBMetricsAddress); err != nil {
		_ = stop()
		return nil, fmt.Errorf("ebb lb did not become ready (logs in %s): %w", filepath.Join(c.Dir(), "logs"), err)
	}
	return func() { _ = stop() }, nil
}

// waitReady polls a component's /readyz until it answers 200.
func waitReady(ctx context.Context, address string) error {
	return wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+address+"/readyz", nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil // not listening yet
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}
