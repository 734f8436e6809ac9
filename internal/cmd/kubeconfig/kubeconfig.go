// Package kubeconfig loads the client configuration every ebb subcommand
// that talks to a cluster uses.
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
)

// Load reads the kubeconfig file at path, or, with no path, the in-cluster
// configuration, then $KUBECONFIG and ~/.kube/config.
func Load(path string) (*rest.Config, error) {
	if path == "" {
		cfg, err := ctrl.GetConfig()
		if err != nil {
			return nil, fmt.Errorf("loading the cluster configuration (in-cluster, $KUBECONFIG or ~/.kube/config; or give --kubeconfig): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}
