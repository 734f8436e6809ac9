package controller

import "testing"

// Installed in another namespace than ebb-system (helm install -n), the
// controller finds its own objects there: the flags that name them default
// to $POD_NAMESPACE, which the manifests set.
func TestFlagsNameEbbsObjectsInThePodsNamespace(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "lb-system")
	f := NewCommand().Flags()
	for name, want := range map[string]string{
		"webhook-cert-secret":   "lb-system/ebb-webhook-cert",
		"webhook-dns-name":      "[ebb-webhook-service.lb-system.svc,ebb-webhook-service.lb-system.svc.cluster.local]",
		"l2-key-secret":         "lb-system/ebb-l2-key",
		"lb-namespace":          "lb-system",
		"eviction-guard-exempt": "[system:serviceaccount:lb-system:ebb-controller]",
	} {
		if got := f.Lookup(name).DefValue; got != want {
			t.Errorf("--%s defaults to %s, want %s", name, got, want)
		}
	}
}
