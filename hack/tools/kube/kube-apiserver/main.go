// Command kube-apiserver is the upstream kube-apiserver, built from the
// k8s.io/kubernetes module at the version pinned in go.mod, for ebb's local
// cluster. It only exists because prebuilt binaries cannot be downloaded.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
