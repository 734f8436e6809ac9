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
}

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
//   - minSyncPeriod 0: rules follow every endpoint change at once (the
//     default 1 s batches changes for clusters with thousands of Services;
//     tests here measure how fast ebb reacts, not kube-proxy).
//   - conntrack sizes and timeouts 0 ("leave as is"): a node's namespace
//     may not set the host's conntrack table size.
//   - metrics on loopback only.
func config(node Node, kubeconfig string) string {
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
  minSyncPeriod: 0s
  syncPeriod: 30s
`, node.Name, strings.Join(node.ClusterCIDRs, ","), HealthPort, kubeconfig)
}
