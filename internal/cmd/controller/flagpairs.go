package controller

import "fmt"

// checkFlagPairs refuses a flag that would do nothing for want of the one
// it needs, rather than drop a hardening the operator asked for unseen.
func (o *Options) checkFlagPairs() error {
	if o.Webhook.ClientCAFile != "" && o.Webhook.Port == 0 {
		return fmt.Errorf("--webhook-client-ca-file needs the webhook server: --webhook-port is 0")
	}
	if o.AzureConfigSecret != "" && o.Cloud != "azure" {
		return fmt.Errorf("--azure-config-secret is read only with --cloud azure")
	}
	return nil
}
