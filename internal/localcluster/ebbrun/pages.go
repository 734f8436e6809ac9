package ebbrun

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// Where installed ebb serves its metrics (config/): ebb lb on its host's
// loopback (the host network is shared, so not on every address), the
// controller on its pod's loopback.
const (
	LBMetricsAddress         = "127.0.0.1:9464"
	ControllerMetricsAddress = "127.0.0.1:8080"
)

// LBPage gets path (/metrics, /readyz) from the ebb lb on node's host.
func LBPage(ctx context.Context, c *localcluster.Cluster, node localcluster.Node, path string) (string, error) {
	h, ok := c.Network.Host(node.Name)
	if !ok {
		return "", fmt.Errorf("no host %s", node.Name)
	}
	return getOn(ctx, h, LBMetricsAddress, path)
}

// ControllerPage gets path from the replica of the installed ebb
// controller that holds its leader Lease, inside its pod's network
// namespace: the one whose reconcile and write counters move.
func ControllerPage(ctx context.Context, c *localcluster.Cluster, path string) (string, error) {
	lease, err := c.Client.CoordinationV1().Leases(Namespace).Get(ctx, controllerDeployment, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("finding the controller's leader: %w", err)
	}
	name, _, _ := strings.Cut(ptr.Deref(lease.Spec.HolderIdentity, ""), "_")
	pod, err := c.Client.CoreV1().Pods(Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading the controller's leader: %w", err)
	}
	h, closeHost, err := c.PodHost(pod)
	if err != nil {
		return "", fmt.Errorf("reaching the controller's leader: %w", err)
	}
	defer closeHost()
	return getOn(ctx, h, ControllerMetricsAddress, path)
}

// getOn gets http://address/path from inside host's network namespace.
func getOn(ctx context.Context, h *network.Host, address, path string) (string, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return h.DialContext(ctx, network, address)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+address+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("GET %s on %s: %w", path, h.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("GET %s on %s: %w", path, h.Name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("GET %s on %s: status %d", path, h.Name, resp.StatusCode)
	}
	return string(body), nil
}
