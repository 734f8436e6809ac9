// Command containerd is containerd's daemon, built from the
// github.com/containerd/containerd/v2 module pinned in go.mod. Each real node
// of the local cluster runs one (CRI for its kubelet) in the node's own
// network and mount namespaces.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/cmd/containerd/command"

	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
)

func main() {
	if err := command.App().Run(context.Background(), os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "containerd:", err)
		os.Exit(1)
	}
}
