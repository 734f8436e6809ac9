// Command kube-scheduler is the upstream kube-scheduler, built from the
// k8s.io/kubernetes module pinned in go.mod.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() { os.Exit(cli.Run(app.NewSchedulerCommand())) }
