// Command containerd-shim-runc-v2 is containerd's runc shim (one per pod),
// built from the module pinned in go.mod; containerd finds it on its PATH.
package main

import (
	"context"

	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task/plugin"
	"github.com/containerd/containerd/v2/pkg/shim"
)

func main() {
	shim.RunShim(context.Background(), manager.NewShimManager("io.containerd.runc.v2"))
}
