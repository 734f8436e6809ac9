package controller

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// The Azure configuration comes from --azure-config-secret when set (key
// cloud-config, as cloud-provider-azure keeps it, else azure.json), so that
// a client secret may live where ebb lb cannot read it (issue 42 item 3);
// else from the --azure-config file. What is wrong is said with the fix.
func TestLoadAzureConfig(t *testing.T) {
	const config = `{"cloud":"AzurePublicCloud","tenantId":"t","subscriptionId":"sub","resourceGroup":"rg","useManagedIdentityExtension":true}`
	file := filepath.Join(t.TempDir(), "azure.json")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	secret := func(ns, name string, data map[string]string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{}}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		return s
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		secret("kube-system", "azure-cloud-provider", map[string]string{"cloud-config": config}),
		secret("kube-system", "as-file", map[string]string{"azure.json": config}),
		secret("kube-system", "other-keys", map[string]string{"config": config}),
		secret("kube-system", "yaml", map[string]string{"cloud-config": "cloud: AzurePublicCloud\ntenantId: t\nsubscriptionId: sub\nresourceGroup: rg\nuseManagedIdentityExtension: true\n"}),
		secret("kube-system", "broken", map[string]string{"cloud-config": "{"}),
	).Build()
	for _, c := range []struct {
		file, secret string
		from, err    string
	}{
		{file: file, from: file},
		{file: "/nowhere/azure.json", err: "no such file"},
		{secret: "kube-system/azure-cloud-provider", from: "Secret kube-system/azure-cloud-provider, key cloud-config"},
		{secret: "kube-system/as-file", from: "Secret kube-system/as-file, key azure.json"},
		{secret: "kube-system/other-keys", err: "has no key cloud-config or azure.json holding azure.json"},
		// cloud-provider-azure reads YAML there too.
		{secret: "kube-system/yaml", from: "Secret kube-system/yaml, key cloud-config"},
		{secret: "kube-system/broken", err: "Secret kube-system/broken, key cloud-config: the Azure configuration is not valid JSON or YAML"},
		{secret: "kube-system/missing", err: "config/components/azure-config-secret"},
		{secret: "azure-cloud-provider", err: "want namespace/name"},
	} {
		o := &Options{AzureConfig: c.file, AzureConfigSecret: c.secret}
		cfg, from, err := o.loadAzureConfig(context.Background(), api)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s%s: %v, want an error saying %q", c.file, c.secret, err, c.err)
		case c.err == "" && (err != nil || cfg.ResourceGroup != "rg" || from != c.from):
			t.Errorf("%s%s: %v from %q (%v), want rg from %q", c.file, c.secret, cfg, from, err, c.from)
		}
	}
}

// A flag that would do nothing for want of the one it needs stops the
// controller at start.
func TestFlagPairs(t *testing.T) {
	for _, c := range []struct {
		o   Options
		err string
	}{
		{Options{Webhook: WebhookOptions{Port: 9443, ClientCAFile: "ca.crt"}, AzureConfigSecret: "kube-system/azure-cloud-provider", Cloud: "azure"}, ""},
		{Options{Webhook: WebhookOptions{ClientCAFile: "ca.crt"}}, "--webhook-port is 0"},
		{Options{Webhook: WebhookOptions{Port: 9443}, AzureConfigSecret: "kube-system/azure-cloud-provider"}, "only with --cloud azure"},
	} {
		err := c.o.checkFlagPairs()
		if (c.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("%+v: %v, want %q", c.o, err, c.err)
		}
	}
}
