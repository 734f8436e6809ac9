package ebbrun

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ebbdev/ebb/config"
	"github.com/ebbdev/ebb/internal/localcluster"
)

// WebhookAddress is where StartEbb's controller serves admission, inside
// the cluster's namespace; the apiserver calls it by URL.
const WebhookAddress = "127.0.0.1:19443"

// Names StartEbb gives the webhook configurations (as config/ does).
const (
	mutatingConfiguration   = "ebb-mutating-webhook-configuration"
	validatingConfiguration = "ebb-validating-webhook-configuration"
	ebbNamespace            = "ebb-system"
)

// InstallAPI installs ebb's CustomResourceDefinitions and webhook
// configurations (from config/, pointed at WebhookAddress) and the
// ebb-system namespace, and waits for the CRDs to be served.
func InstallAPI(ctx context.Context, c *localcluster.Cluster) error {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{apiextensionsv1.AddToScheme, admissionregistrationv1.AddToScheme, corev1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	cl, err := client.New(c.Config, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	files, err := fs.Glob(config.CRDs, "crd/bases/*.yaml")
	if err != nil {
		return err
	}
	for _, f := range files {
		data, err := config.CRDs.ReadFile(f)
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			return fmt.Errorf("decoding %s: %w", f, err)
		}
		if err := apply(ctx, cl, crd); err != nil {
			return err
		}
		if err := waitEstablished(ctx, cl, crd.Name); err != nil {
			return err
		}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ebbNamespace}}
	if err := cl.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", ebbNamespace, err)
	}
	for _, doc := range bytes.Split(config.WebhookManifests, []byte("\n---\n")) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil || meta.Kind == "" {
			continue
		}
		switch meta.Kind {
		case "MutatingWebhookConfiguration":
			cfg := &admissionregistrationv1.MutatingWebhookConfiguration{}
			if err := yaml.UnmarshalStrict(doc, cfg); err != nil {
				return fmt.Errorf("decoding the mutating webhooks: %w", err)
			}
			cfg.Name = mutatingConfiguration
			for i := range cfg.Webhooks {
				cfg.Webhooks[i].ClientConfig = byURL(cfg.Webhooks[i].ClientConfig)
			}
			if err := apply(ctx, cl, cfg); err != nil {
				return err
			}
		case "ValidatingWebhookConfiguration":
			cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
			if err := yaml.UnmarshalStrict(doc, cfg); err != nil {
				return fmt.Errorf("decoding the validating webhooks: %w", err)
			}
			cfg.Name = validatingConfiguration
			for i := range cfg.Webhooks {
				cfg.Webhooks[i].ClientConfig = byURL(cfg.Webhooks[i].ClientConfig)
			}
			if err := apply(ctx, cl, cfg); err != nil {
				return err
			}
		}
	}
	return nil
}

// byURL points a webhook at WebhookAddress instead of a Service: the
// controller runs as a process next to the apiserver.
func byURL(cc admissionregistrationv1.WebhookClientConfig) admissionregistrationv1.WebhookClientConfig {
	path := "/"
	if cc.Service != nil && cc.Service.Path != nil {
		path = *cc.Service.Path
	}
	return admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://" + WebhookAddress + path)}
}

// apply creates obj or replaces the existing one's spec.
func apply(ctx context.Context, cl client.Client, obj client.Object) error {
	err := cl.Create(ctx, obj)
	if !apierrors.IsAlreadyExists(err) {
		if err != nil {
			return fmt.Errorf("creating %T %s: %w", obj, obj.GetName(), err)
		}
		return nil
	}
	existing := obj.DeepCopyObject().(client.Object)
	if err := cl.Get(ctx, client.ObjectKeyFromObject(obj), existing); err != nil {
		return fmt.Errorf("reading %T %s: %w", obj, obj.GetName(), err)
	}
	obj.SetResourceVersion(existing.GetResourceVersion())
	if err := cl.Update(ctx, obj); err != nil {
		return fmt.Errorf("updating %T %s: %w", obj, obj.GetName(), err)
	}
	return nil
}

func waitEstablished(ctx context.Context, cl client.Client, name string) error {
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := cl.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return false, nil
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for CRD %s to be established: %w", name, err)
	}
	return nil
}
