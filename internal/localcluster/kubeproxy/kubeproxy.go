// Package kubeproxy configures the upstream kube-proxy (v1.36, nftables
// mode) that the local cluster runs on each simulated node, in the node's
// own network namespace: node ports, ClusterIPs, externalTrafficPolicy and
// KEP-3836's /healthz and /livez are then kube-proxy's own, not a copy.
package kubeproxy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// HealthPort is where kube-proxy serves /healthz and /livez on every
// address of its node (KEP-3836).
const HealthPort = 10256

// Node is what one node's kube-proxy needs to know.
type Node struct {
	// Name is the Node object's name (kube-proxy's hostnameOverride).
	Name string
	// ClusterCIDRs are the pod ranges: traffic from them is the cluster's
	// own (detectLocalMode ClusterCIDR).
	ClusterCIDRs []string
	// MinSyncPeriod is the least time between two rule syncs; 0 is
	// upstream's default, 1 s.
	MinSyncPeriod time.Duration
}

// DefaultMinSyncPeriod is kube-proxy's own default minSyncPeriod. The
// configuration cannot say 0 ("sync at every change"): kube-proxy's
// defaulting takes 0 for unset and writes 1 s
// (pkg/proxy/apis/config/v1alpha1/defaults.go), so the least that can be
// asked for is a duration above 0.
const DefaultMinSyncPeriod = time.Second

// WriteConfig writes node's KubeProxyConfiguration into dir, with kubeconfig
// as its credentials, and returns kube-proxy's arguments.
func WriteConfig(dir string, node Node, kubeconfig string) ([]string, error) {
	path := filepath.Join(dir, "kube-proxy-"+node.Name+".yaml")
	if err := os.WriteFile(path, []byte(config(node, kubeconfig)), 0o644); err != nil {
		return nil, fmt.Errorf("writing kube-proxy's configuration for %s: %w", node.Name, err)
	}
	return []string{"--config=" + path, "--v=2"}, nil
}

// config renders the configuration. What differs from upstream's defaults,
// and why:
//   - minSyncPeriod: upstream's 1 s unless asked (Node.MinSyncPeriod).
//     Until 2026-11-28 this file said 0s, meaning "at every change"; the
//     defaulting turned it into 1 s, so every figure measured here was
//     with upstream's default, as users' clusters run.
//   - conntrack sizes and timeouts 0 ("leave as is"): a node's namespace
//     may not set the host's conntrack table size.
//   - metrics on loopback only.
func config(node Node, kubeconfig string) string {
	minSync := node.MinSyncPeriod
	if minSync <= 0 {
		minSync = DefaultMinSyncPeriod
	}
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: %s
clusterCIDR: %s
detectLocalMode: ClusterCIDR
healthzBindAddress: 0.0.0.0:%d
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["primary"]
clientConnection:
  kubeconfig: %s
  qps: 50
  burst: 100
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
nftables:
  minSyncPeriod: %s
  syncPeriod: 30s
`, node.Name, strings.Join(node.ClusterCIDRs, ","), HealthPort, kubeconfig, minSync)
}
