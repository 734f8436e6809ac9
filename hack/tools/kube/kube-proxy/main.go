// Command kube-proxy is the upstream kube-proxy, built from the
// k8s.io/kubernetes module pinned in go.mod. The local cluster runs one per
// simulated node, in the node's own network namespace, in nftables mode.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() { os.Exit(cli.Run(app.NewProxyCommand())) }
