// Command kubectl is upstream kubectl at the version pinned in go.mod. The
// local cluster uses it only when the kubectl on PATH is more than one minor
// version away from the cluster's.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"

	// Client auth plugins, as upstream's main registers them.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		os.Exit(1)
	}
}
