// Command pause is the local cluster's pod sandbox: the process that holds a
// pod's namespaces while its containers come and go (containerd's pinned
// sandbox image runs it). It waits for SIGINT or SIGTERM and exits 0, as
// Kubernetes' own pause does; being PID 1 of a pod that shares its process
// namespace, it also reaps the zombies such a pod's containers leave.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
