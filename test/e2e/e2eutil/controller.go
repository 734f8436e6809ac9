package e2eutil

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// ControllerMetricsAddress is an installed controller's
// --metrics-bind-address (config/manager): its pod's loopback.
const ControllerMetricsAddress = "127.0.0.1:8080"

// ControllerMetrics reads the metrics of the leading replica of an
// installed ebb controller, inside its pod's network namespace.
func ControllerMetrics(t *testing.T, ctx context.Context, c *localcluster.Cluster) string {
	t.Helper()
	lease, err := c.Client.CoordinationV1().Leases(ebbrun.Namespace).Get(ctx, "ebb-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("finding the controller's leader: %v", err)
	}
	pod, _, _ := strings.Cut(ptr.Deref(lease.Spec.HolderIdentity, ""), "_")
	h, ok := c.Network.Host(ebbrun.Namespace + "/" + pod)
	if !ok {
		t.Fatalf("the leader %s has no network namespace of its own", pod)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return h.DialContext(ctx, network, ControllerMetricsAddress)
	}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ControllerMetricsAddress+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("scraping the leader %s: %v", pod, err)
	}
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(page)
}
