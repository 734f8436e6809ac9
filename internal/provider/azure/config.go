// Package azure applies ebb's admin-state rules to Azure Load Balancer: a
// leaving node's backend address entries are set AdminState Down on every
// load balancer the cluster owns (and None again when it stays), through
// armnetwork's LoadBalancerBackendAddressPoolsClient. It runs beside
// cloud-provider-azure, which has no code for the admin-state design.
package azure

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"
)

// Backend pool types (cloud-provider-azure's loadBalancerBackendPoolConfigurationType).
const (
	PoolTypeNIC = "nodeIPConfiguration"
	PoolTypeIP  = "nodeIP"
)

// Config is the azure.json subset the admin-state manager needs, with
// cloud-provider-azure's field names.
type Config struct {
	Cloud                     string `json:"cloud"`
	TenantID                  string `json:"tenantId"`
	SubscriptionID            string `json:"subscriptionId"`
	ResourceGroup             string `json:"resourceGroup"`
	LoadBalancerResourceGroup string `json:"loadBalancerResourceGroup"`
	// ClusterName names the default load balancer (cloud-provider-azure's
	// "kubernetes" unless set).
	ClusterName string `json:"clusterName"`
	// LoadBalancerName overrides the default load balancer's name.
	LoadBalancerName string `json:"loadBalancerName"`
	// MultipleStandardLoadBalancerConfigurations lists every Standard load
	// balancer the cluster owns (its name is each entry's name).
	MultipleStandardLoadBalancerConfigurations []struct {
		Name string `json:"name"`
	} `json:"multipleStandardLoadBalancerConfigurations"`
	LoadBalancerSKU                          string `json:"loadBalancerSku"`
	LoadBalancerBackendPoolConfigurationType string `json:"loadBalancerBackendPoolConfigurationType"`
	// EnableLoadBalancerAdminState is the provider toggle of the design.
	EnableLoadBalancerAdminState bool `json:"enableLoadBalancerAdminState"`

	// Credentials: workload identity, managed identity or client secret.
	AADClientID                           string `json:"aadClientId"`
	AADClientSecret                       string `json:"aadClientSecret"`
	UseManagedIdentityExtension           bool   `json:"useManagedIdentityExtension"`
	UserAssignedIdentityID                string `json:"userAssignedIdentityID"`
	UseFederatedWorkloadIdentityExtension bool   `json:"useFederatedWorkloadIdentityExtension"`
	AADFederatedTokenFile                 string `json:"aadFederatedTokenFile"`

	// Location, and the virtual network and subnet of internal load
	// balancers' frontends (cloud-provider-azure's defaults for a
	// Service that names no subnet): the migration rebuilds an internal
	// frontend from them when it resumes after a crash.
	Location          string `json:"location"`
	VnetName          string `json:"vnetName"`
	VnetResourceGroup string `json:"vnetResourceGroup"`
	SubnetName        string `json:"subnetName"`

	// ResourceManagerEndpoint overrides the cloud's ARM endpoint (for a
	// sovereign cloud, or a test server).
	ResourceManagerEndpoint string `json:"resourceManagerEndpoint"`
}

// LoadConfig reads and validates an azure.json file.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the Azure configuration: %w", err)
	}
	return ParseConfig(data)
}

// ParseConfig decodes and validates azure.json content: JSON, or YAML
// with the same keys, as cloud-provider-azure reads it (a cloud-config
// Secret written in YAML is valid there).
func ParseConfig(data []byte) (*Config, error) {
	c := &Config{}
	if err := yaml.Unmarshal(data, c); err != nil {
		return nil, fmt.Errorf("the Azure configuration is not valid JSON or YAML: %w", err)
	}
	if c.LoadBalancerResourceGroup == "" {
		c.LoadBalancerResourceGroup = c.ResourceGroup
	}
	if c.LoadBalancerBackendPoolConfigurationType == "" {
		c.LoadBalancerBackendPoolConfigurationType = PoolTypeNIC
	}
	return c, c.Validate()
}

// Validate says what is missing or wrong, all at once.
func (c *Config) Validate() error {
	var errs []error
	for field, v := range map[string]string{"subscriptionId": c.SubscriptionID, "resourceGroup": c.ResourceGroup, "tenantId": c.TenantID} {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is required", field))
		}
	}
	switch c.LoadBalancerBackendPoolConfigurationType {
	case PoolTypeNIC, PoolTypeIP:
	default:
		errs = append(errs, fmt.Errorf("loadBalancerBackendPoolConfigurationType %q is not supported: use %s or %s", c.LoadBalancerBackendPoolConfigurationType, PoolTypeNIC, PoolTypeIP))
	}
	switch strings.ToLower(c.LoadBalancerSKU) {
	case "", "standard", "basic":
	default:
		errs = append(errs, fmt.Errorf("loadBalancerSku %q is not an Azure load balancer SKU: use standard (or basic, to migrate from it)", c.LoadBalancerSKU))
	}
	secret := c.AADClientID != "" && c.AADClientSecret != ""
	if !secret && !c.UseManagedIdentityExtension && !c.UseFederatedWorkloadIdentityExtension {
		errs = append(errs, errors.New("no credentials: set aadClientId and aadClientSecret, useManagedIdentityExtension, or useFederatedWorkloadIdentityExtension"))
	}
	if c.UseFederatedWorkloadIdentityExtension && c.AADClientID == "" {
		errs = append(errs, errors.New("useFederatedWorkloadIdentityExtension needs aadClientId"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("the Azure configuration: %w", err)
	}
	return nil
}

// ValidateForAdminState says why admin state cannot run with this
// configuration: it needs Standard load balancers. (A Basic configuration
// is valid for the migration itself.)
func (c *Config) ValidateForAdminState() error {
	if strings.EqualFold(c.LoadBalancerSKU, "basic") {
		return errors.New("loadBalancerSku is basic: admin state needs Standard load balancers; run `ebb azure migrate-basic-lb`, then set loadBalancerSku to standard and restart cloud-controller-manager and ebb controller")
	}
	return nil
}

// LoadBalancerNames are the Standard load balancers the cluster owns.
func (c *Config) LoadBalancerNames() []string {
	if len(c.MultipleStandardLoadBalancerConfigurations) > 0 {
		var out []string
		for _, l := range c.MultipleStandardLoadBalancerConfigurations {
			out = append(out, l.Name)
		}
		return out
	}
	switch {
	case c.LoadBalancerName != "":
		return []string{c.LoadBalancerName}
	case c.ClusterName != "":
		return []string{c.ClusterName}
	}
	return []string{"kubernetes"}
}

// internalSuffix names a load balancer's internal twin, as
// cloud-provider-azure does: internal Services' frontends live on
// "<name>-internal".
const internalSuffix = "-internal"

// AdminStateLoadBalancers are the load balancers whose backends carry
// admin state: every Standard load balancer of the cluster and its
// internal twin (either may not exist yet).
func (c *Config) AdminStateLoadBalancers() []string {
	var out []string
	for _, lb := range c.LoadBalancerNames() {
		out = append(out, lb, lb+internalSuffix)
	}
	return out
}

// BackendPoolNames are the node pools cloud-provider-azure manages on
// each of those load balancers: "<cluster>" for IPv4 and "<cluster>-IPv6"
// for IPv6. Other pools (an outbound-only pool, a user's own) are not
// ebb's to write.
func (c *Config) BackendPoolNames() []string {
	cluster := c.ClusterName
	if cluster == "" {
		cluster = "kubernetes"
	}
	return []string{cluster, cluster + "-IPv6"}
}
