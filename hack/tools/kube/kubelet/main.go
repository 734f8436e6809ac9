// Command kubelet is the upstream kubelet, built from the k8s.io/kubernetes
// module pinned in go.mod. Each real node of the local cluster runs one, in
// the node's own network and mount namespaces, against the node's containerd.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() { os.Exit(cli.Run(app.NewKubeletCommand(context.Background()))) }
