package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Only the Secret and the webhook configurations of the default install,
// by name (a create cannot be limited to a name). Installs that rename them
// extend these rules; docs/security.md.
// +kubebuilder:rbac:groups="",namespace=ebb-system,resources=secrets,verbs=create
// +kubebuilder:rbac:groups="",namespace=ebb-system,resources=secrets,verbs=get;update,resourceNames=ebb-webhook-cert
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations,verbs=get;patch,resourceNames=ebb-mutating-webhook-configuration
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,verbs=get;patch,resourceNames=ebb-validating-webhook-configuration;ebb-eviction-guard

// Keys of the certificate Secret. The CA's key is kept so that a serving
// certificate is renewed under the same CA: the webhook configurations'
// caBundle, which the API server trusts, stays valid through a renewal.
const (
	caCertKey  = "ca.crt"
	caKeyKey   = "ca.key"
	certKey    = corev1.TLSCertKey
	privKeyKey = corev1.TLSPrivateKeyKey
)

// Lifetimes: the serving certificate lives a year and is replaced 30 days
// before its end; the CA lives ten years.
const (
	renewBefore  = 30 * 24 * time.Hour
	servingLife  = 365 * 24 * time.Hour
	caLife       = 10 * 365 * 24 * time.Hour
	caRenewAhead = servingLife + renewBefore
)

// SelfSignedCerts manages the webhook's serving certificate without
// cert-manager: a CA and a serving certificate kept in a Secret (so every
// replica serves the same one), written to CertDir, with the CA injected
// into the webhook configurations.
type SelfSignedCerts struct {
	// Client must not be a cached one: this runs before caches start.
	Client client.Client
	Secret types.NamespacedName
	// DNSNames and IPs the serving certificate is valid for.
	DNSNames []string
	IPs      []net.IP
	CertDir  string
	// Mutating and Validating name the webhook configurations to inject
	// the CA into.
	Mutating, Validating []string
	Now                  func() time.Time
}

// Ensure makes sure a valid certificate exists, is on disk and is trusted
// by the webhook configurations. It is cheap when all is in place (one
// read of the Secret and of each configuration, nothing written), so
// Rotate calls it periodically.
func (s *SelfSignedCerts) Ensure(ctx context.Context) error {
	if s.Now == nil {
		s.Now = time.Now
	}
	data, err := s.secret(ctx)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.CertDir, 0o700); err != nil {
		return fmt.Errorf("creating the webhook certificate directory: %w", err)
	}
	// The key first, then the certificate: controller-runtime's certificate
	// watcher reloads on a change, and must not pair a new certificate
	// with the old key for long. Unchanged files are not rewritten.
	for _, k := range []string{privKeyKey, certKey} {
		path := filepath.Join(s.CertDir, k)
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data[k]) {
			continue
		}
		if err := os.WriteFile(path+".tmp", data[k], 0o600); err != nil {
			return fmt.Errorf("writing the webhook certificate: %w", err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			return fmt.Errorf("writing the webhook certificate: %w", err)
		}
	}
	return s.inject(ctx, data[caCertKey])
}

// Rotate runs Ensure every period until ctx is done: a certificate nearing
// its end is renewed (by whichever replica gets there first; the others
// pick it up from the Secret) and every replica's files follow, which the
// webhook server reloads while running. Every replica runs it, leader or
// not.
func (s *SelfSignedCerts) Rotate(period time.Duration) manager.Runnable {
	return rotator{s: s, period: period}
}

type rotator struct {
	s      *SelfSignedCerts
	period time.Duration
}

func (r rotator) NeedLeaderElection() bool { return false }

func (r rotator) Start(ctx context.Context) error {
	t := time.NewTicker(r.period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := r.s.Ensure(ctx); err != nil && ctx.Err() == nil {
				log.FromContext(ctx).Error(err, "Renewing the webhook certificate; retrying next period", "period", r.period)
			}
		}
	}
}

// secret returns the Secret's data, creating or renewing it when needed.
func (s *SelfSignedCerts) secret(ctx context.Context) (map[string][]byte, error) {
	for attempt := 0; ; attempt++ {
		var sec corev1.Secret
		err := s.Client.Get(ctx, s.Secret, &sec)
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading the webhook certificate Secret %s: %w", s.Secret, err)
		}
		exists := err == nil
		if exists && s.valid(sec.Data) {
			return sec.Data, nil
		}
		data, genErr := s.generate(sec.Data)
		if genErr != nil {
			return nil, genErr
		}
		sec.Data, sec.Type = data, corev1.SecretTypeTLS
		if exists {
			err = s.Client.Update(ctx, &sec)
		} else {
			sec.ObjectMeta = metav1.ObjectMeta{Namespace: s.Secret.Namespace, Name: s.Secret.Name, Labels: map[string]string{"app.kubernetes.io/managed-by": "ebb"}}
			err = s.Client.Create(ctx, &sec)
		}
		switch {
		case err == nil:
			return data, nil
		case (apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err)) && attempt < 3:
			continue // another replica wrote it first: use theirs
		default:
			return nil, fmt.Errorf("writing the webhook certificate Secret %s: %w", s.Secret, err)
		}
	}
}

// valid reports whether data holds a key pair that is not near its end and
// covers every name.
func (s *SelfSignedCerts) valid(data map[string][]byte) bool {
	if len(data[caCertKey]) == 0 {
		return false
	}
	pair, err := tls.X509KeyPair(data[certKey], data[privKeyKey])
	if err != nil {
		return false
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil || s.Now().Add(renewBefore).After(cert.NotAfter) {
		return false
	}
	for _, n := range s.DNSNames {
		if !slices.Contains(cert.DNSNames, n) {
			return false
		}
	}
	for _, ip := range s.IPs {
		if !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

// generate makes a serving certificate (1 year) under the CA in old when
// it has one with its key that outlives the new certificate, else under a
// new CA (10 years).
func (s *SelfSignedCerts) generate(old map[string][]byte) (map[string][]byte, error) {
	now := s.Now()
	ca, caKey, caPEM, caKeyPEM := s.reusableCA(old)
	if ca == nil {
		var err error
		if ca, caKey, caPEM, caKeyPEM, err = newCA(now); err != nil {
			return nil, err
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating the webhook key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano() + 1), Subject: pkix.Name{CommonName: firstOr(s.DNSNames, "ebb-webhook")},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(servingLife),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: s.DNSNames, IPAddresses: s.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing the webhook certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding the webhook key: %w", err)
	}
	return map[string][]byte{
		caCertKey:  caPEM,
		caKeyKey:   caKeyPEM,
		certKey:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		privKeyKey: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// reusableCA returns the CA in data when its key is there and it outlives
// a new serving certificate by the renewal margin (nil otherwise).
func (s *SelfSignedCerts) reusableCA(data map[string][]byte) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte) {
	certBlock, _ := pem.Decode(data[caCertKey])
	keyBlock, _ := pem.Decode(data[caKeyKey])
	if certBlock == nil || keyBlock == nil {
		return nil, nil, nil, nil
	}
	ca, err := x509.ParseCertificate(certBlock.Bytes)
	if err != nil || !ca.IsCA || s.Now().Add(caRenewAhead).After(ca.NotAfter) {
		return nil, nil, nil, nil
	}
	key, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	if err != nil || !key.PublicKey.Equal(ca.PublicKey) {
		return nil, nil, nil, nil
	}
	return ca, key, data[caCertKey], data[caKeyKey]
}

// newCA makes a self-signed CA valid ten years.
func newCA(now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("generating the webhook CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: "ebb-webhook-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(caLife),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, IsCA: true, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("signing the webhook CA: %w", err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	keyDER, err := x509.MarshalECPrivateKey(caKey)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("encoding the webhook CA key: %w", err)
	}
	return ca, caKey, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

func firstOr(names []string, def string) string {
	if len(names) > 0 {
		return names[0]
	}
	return def
}

// inject sets caBundle on every webhook of the named configurations.
func (s *SelfSignedCerts) inject(ctx context.Context, ca []byte) error {
	for _, name := range s.Mutating {
		if err := s.patchCA(ctx, "MutatingWebhookConfiguration", name, &admissionregistrationv1.MutatingWebhookConfiguration{}, ca); err != nil {
			return err
		}
	}
	for _, name := range s.Validating {
		if err := s.patchCA(ctx, "ValidatingWebhookConfiguration", name, &admissionregistrationv1.ValidatingWebhookConfiguration{}, ca); err != nil {
			return err
		}
	}
	return nil
}

// clientConfigs are the client configurations of a webhook configuration's
// webhooks, to be changed in place.
func clientConfigs(obj client.Object) []*admissionregistrationv1.WebhookClientConfig {
	var out []*admissionregistrationv1.WebhookClientConfig
	switch cfg := obj.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		for i := range cfg.Webhooks {
			out = append(out, &cfg.Webhooks[i].ClientConfig)
		}
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		for i := range cfg.Webhooks {
			out = append(out, &cfg.Webhooks[i].ClientConfig)
		}
	}
	return out
}

// patchCA reads one webhook configuration into obj and, if any of its
// webhooks lacks ca, patches it in.
func (s *SelfSignedCerts) patchCA(ctx context.Context, kind, name string, obj client.Object, ca []byte) error {
	if err := s.Client.Get(ctx, types.NamespacedName{Name: name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			// An optional configuration (the eviction guard's) that an
			// administrator removed: nothing to keep valid. Failing here
			// would stop the controller, and with it every webhook.
			log.FromContext(ctx).Info("Webhook configuration not found: not injecting the CA into it", "kind", kind, "name", name)
			return nil
		}
		return fmt.Errorf("reading %s %s to inject the CA: %w", kind, name, err)
	}
	patch := client.MergeFromWithOptions(obj.DeepCopyObject().(client.Object), client.MergeFromWithOptimisticLock{})
	changed := false
	for _, cc := range clientConfigs(obj) {
		if !bytes.Equal(cc.CABundle, ca) {
			cc.CABundle, changed = ca, true
		}
	}
	if !changed {
		return nil
	}
	if err := s.Client.Patch(ctx, obj, patch); err != nil {
		return fmt.Errorf("injecting the CA into %s %s: %w", kind, name, err)
	}
	return nil
}
