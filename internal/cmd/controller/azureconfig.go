package controller

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ebbdev/ebb/internal/provider/azure"
)

// azureConfigKeys are the keys of --azure-config-secret that may hold
// azure.json, in the order looked for: cloud-provider-azure's own (its
// Secret kube-system/azure-cloud-provider, with cloudConfigType secret),
// then the file's name.
var azureConfigKeys = []string{"cloud-config", "azure.json"}

// loadAzureConfig reads the Azure configuration: through the API from
// --azure-config-secret when set (a Secret outside ebb-system, where ebb
// lb's service account cannot read it: a client secret in it stays out of
// every LB host's reach), else from the --azure-config file. It returns
// where the configuration came from, for messages.
func (o *Options) loadAzureConfig(ctx context.Context, r client.Reader) (*azure.Config, string, error) {
	if o.AzureConfigSecret == "" {
		cfg, err := azure.LoadConfig(o.AzureConfig)
		return cfg, o.AzureConfig, err
	}
	ns, name, ok := strings.Cut(o.AzureConfigSecret, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, "", fmt.Errorf("--azure-config-secret %q: want namespace/name, e.g. kube-system/azure-cloud-provider", o.AzureConfigSecret)
	}
	var s corev1.Secret
	if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		return nil, "", fmt.Errorf("reading the Azure configuration from Secret %s (ebb controller needs get on it: config/components/azure-config-secret): %w", o.AzureConfigSecret, err)
	}
	for _, key := range azureConfigKeys {
		if data, ok := s.Data[key]; ok {
			from := fmt.Sprintf("Secret %s, key %s", o.AzureConfigSecret, key)
			cfg, err := azure.ParseConfig(data)
			if err != nil {
				return nil, from, fmt.Errorf("%s: %w", from, err)
			}
			return cfg, from, nil
		}
	}
	return nil, "", fmt.Errorf("the Secret %s has no key %s holding azure.json", o.AzureConfigSecret, strings.Join(azureConfigKeys, " or "))
}
