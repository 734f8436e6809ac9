// Package podns says which namespace ebb's components run in, for the
// defaults of the flags that name ebb's own objects (Secrets, the
// webhook's Service, service accounts): $POD_NAMESPACE, which the
// manifests and the Helm chart set from the downward API, else
// ebb-system (config/default's namespace).
package podns

import "os"

// Default is config/default's namespace.
const Default = "ebb-system"

// Namespace is $POD_NAMESPACE, else Default.
func Namespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return Default
}
