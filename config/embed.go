// Package config embeds the generated CustomResourceDefinitions and
// webhook configurations, so that the local cluster and the demo install
// exactly what `kubectl apply -k config/default` does.
package config

import "embed"

// CRDs are the CustomResourceDefinitions, one per file.
//
//go:embed crd/bases/*.yaml
var CRDs embed.FS

// WebhookManifests are the generated webhook configurations (a mutating
// and a validating one), pointing at the ebb-webhook-service Service.
//
//go:embed webhook/manifests.yaml
var WebhookManifests []byte
