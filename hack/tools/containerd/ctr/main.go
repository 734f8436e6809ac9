// Command ctr is containerd's client, built from the module pinned in go.mod;
// the local cluster imports its images into each node's containerd with it.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/cmd/ctr/app"
)

func main() {
	if err := app.New().Run(context.Background(), os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "ctr:", err)
		os.Exit(1)
	}
}
