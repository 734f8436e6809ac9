package azure

import (
	"fmt"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
)

// cloudConfiguration is the Azure cloud the configuration names, or a
// custom resource manager endpoint.
func (c *Config) cloudConfiguration() (cloud.Configuration, error) {
	var conf cloud.Configuration
	switch strings.ToLower(c.Cloud) {
	case "", "azurepubliccloud", "azurecloud":
		conf = cloud.AzurePublic
	case "azurechinacloud":
		conf = cloud.AzureChina
	case "azureusgovernmentcloud":
		conf = cloud.AzureGovernment
	default:
		if c.ResourceManagerEndpoint == "" {
			return conf, fmt.Errorf("cloud %q is not known: use AzurePublicCloud, AzureChinaCloud or AzureUSGovernmentCloud, or set resourceManagerEndpoint", c.Cloud)
		}
		conf = cloud.AzurePublic
	}
	if c.ResourceManagerEndpoint != "" {
		conf.Services = map[cloud.ServiceName]cloud.ServiceConfiguration{
			cloud.ResourceManager: {Endpoint: c.ResourceManagerEndpoint, Audience: conf.Services[cloud.ResourceManager].Audience},
		}
	}
	return conf, nil
}

// ClientOptions are the ARM client options for the configured cloud.
func (c *Config) ClientOptions() (*arm.ClientOptions, error) {
	conf, err := c.cloudConfiguration()
	if err != nil {
		return nil, err
	}
	return &arm.ClientOptions{ClientOptions: policy.ClientOptions{Cloud: conf}}, nil
}

// Credential returns the configured credential: workload identity, then
// managed identity, then client secret.
func (c *Config) Credential() (azcore.TokenCredential, error) {
	conf, err := c.cloudConfiguration()
	if err != nil {
		return nil, err
	}
	opts := azcore.ClientOptions{Cloud: conf}
	switch {
	case c.UseFederatedWorkloadIdentityExtension:
		return azidentity.NewWorkloadIdentityCredential(&azidentity.WorkloadIdentityCredentialOptions{
			ClientOptions: opts, ClientID: c.AADClientID, TenantID: c.TenantID, TokenFilePath: c.AADFederatedTokenFile,
		})
	case c.UseManagedIdentityExtension:
		mo := &azidentity.ManagedIdentityCredentialOptions{ClientOptions: opts}
		if c.UserAssignedIdentityID != "" {
			mo.ID = azidentity.ClientID(c.UserAssignedIdentityID)
		}
		return azidentity.NewManagedIdentityCredential(mo)
	default:
		return azidentity.NewClientSecretCredential(c.TenantID, c.AADClientID, c.AADClientSecret,
			&azidentity.ClientSecretCredentialOptions{ClientOptions: opts})
	}
}
