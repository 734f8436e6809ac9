package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// The first replica creates the certificate Secret, a second one reuses it,
// a certificate close to its end or missing a name is replaced, and the CA
// is injected into every webhook.
func TestSelfSignedCerts(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = corev1.AddToScheme(scheme)
	_ = admissionregistrationv1.AddToScheme(scheme)
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "a"}}},
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "v"}, Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "b"}, {Name: "c"}}},
	).Build()
	now := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	certs := func(dir string, names ...string) *SelfSignedCerts {
		return &SelfSignedCerts{Client: cl, Secret: types.NamespacedName{Namespace: "ebb-system", Name: "cert"}, DNSNames: names,
			IPs: []net.IP{net.ParseIP("127.0.0.1")}, CertDir: dir, Mutating: []string{"m"}, Validating: []string{"v"}, Now: func() time.Time { return now }}
	}
	ctx := context.Background()
	first := certs(t.TempDir(), "svc.ns.svc")
	if err := first.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	secret := func() *corev1.Secret {
		s := &corev1.Secret{}
		if err := cl.Get(ctx, first.Secret, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	ca := secret().Data[caCertKey]
	leaf := serving(t, first.CertDir)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "svc.ns.svc", Roots: pool, CurrentTime: now}); err != nil {
		t.Errorf("the serving certificate does not verify against the CA: %v", err)
	}
	var v admissionregistrationv1.ValidatingWebhookConfiguration
	_ = cl.Get(ctx, client.ObjectKey{Name: "v"}, &v)
	for _, w := range v.Webhooks {
		if string(w.ClientConfig.CABundle) != string(ca) {
			t.Errorf("webhook %s has no CA bundle", w.Name)
		}
	}

	second := certs(t.TempDir(), "svc.ns.svc")
	if err := second.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if string(secret().Data[caCertKey]) != string(ca) || !serving(t, second.CertDir).Equal(leaf) {
		t.Error("a second replica replaced a valid certificate")
	}

	renamed := certs(t.TempDir(), "svc.ns.svc", "other.ns.svc")
	if err := renamed.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if string(secret().Data[caCertKey]) == string(ca) {
		t.Error("a certificate without a needed name was kept")
	}
	late := certs(t.TempDir(), "svc.ns.svc", "other.ns.svc")
	late.Now = func() time.Time { return now.Add(340 * 24 * time.Hour) }
	before := string(secret().Data[certKey])
	if err := late.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if string(secret().Data[certKey]) == before {
		t.Error("a certificate 25 days from its end was kept")
	}
}

func serving(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	crt, _ := os.ReadFile(filepath.Join(dir, certKey))
	key, _ := os.ReadFile(filepath.Join(dir, privKeyKey))
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		t.Fatalf("the files in the certificate directory: %v", err)
	}
	c, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return c
}
