// Command kubectl-maintenance is the `kubectl maintenance` plugin: start,
// watch, explain and complete NodeMaintenances.
package main

import (
	"os"

	"github.com/ebbdev/ebb/internal/cmd/kubectlmaintenance"
)

func main() {
	if err := kubectlmaintenance.NewCommand(os.Stdout, os.Stderr).Execute(); err != nil {
		os.Exit(1)
	}
}
