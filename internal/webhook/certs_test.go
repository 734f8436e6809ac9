package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
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
			IPs: []net.IP{net.ParseIP("127.0.0.1")}, CertDir: dir, Mutating: []string{"m"},
			// "guard" is not there: an optional configuration an
			// administrator removed is skipped, not an error that stops
			// the controller (and every webhook with it).
			Validating: []string{"v", "guard"}, Now: func() time.Time { return now }}
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
	if got := serving(t, renamed.CertDir); got.Equal(leaf) || !slices.Contains(got.DNSNames, "other.ns.svc") {
		t.Error("a certificate without a needed name was kept")
	}
	if string(secret().Data[caCertKey]) != string(ca) {
		t.Error("the CA changed: the API server's trust would break while replicas catch up")
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
	c, err := servingNow(dir)
	if err != nil {
		t.Fatalf("the files in the certificate directory: %v", err)
	}
	return c
}

// servingNow reads the certificate the files hold. While a renewal writes
// them, the new key may sit beside the old certificate for a moment (the
// certificate watcher rereads on the next change): that is an error here.
func servingNow(dir string) (*x509.Certificate, error) {
	crt, _ := os.ReadFile(filepath.Join(dir, certKey))
	key, _ := os.ReadFile(filepath.Join(dir, privKeyKey))
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(pair.Certificate[0])
}

// A renewal keeps the CA (so the caBundle the API server trusts stays
// valid), a Secret from before the CA key was kept gets a new CA, and
// Rotate renews while running: every replica's files follow.
func TestRenewalKeepsTheCAAndRotateFollows(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = corev1.AddToScheme(scheme)
	_ = admissionregistrationv1.AddToScheme(scheme)
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "v"}, Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "b"}}},
	).Build()
	start := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	var now atomic.Int64
	now.Store(start.UnixNano())
	s := &SelfSignedCerts{Client: cl, Secret: types.NamespacedName{Namespace: "ebb-system", Name: "cert"}, DNSNames: []string{"svc.ns.svc"},
		CertDir: t.TempDir(), Validating: []string{"v"}, Now: func() time.Time { return time.Unix(0, now.Load()) }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := s.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	first := serving(t, s.CertDir)
	bundle := func() *x509.CertPool {
		var v admissionregistrationv1.ValidatingWebhookConfiguration
		if err := cl.Get(ctx, client.ObjectKey{Name: "v"}, &v); err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(v.Webhooks[0].ClientConfig.CABundle)
		return pool
	}
	trusted := bundle()

	rotating := make(chan struct{})
	go func() {
		defer close(rotating)
		_ = s.Rotate(5 * time.Millisecond).Start(ctx)
	}()
	late := start.Add(340 * 24 * time.Hour)
	now.Store(late.UnixNano())
	deadline := time.Now().Add(5 * time.Second)
	for c, err := servingNow(s.CertDir); err != nil || c.Equal(first); c, err = servingNow(s.CertDir) {
		if time.Now().After(deadline) {
			t.Fatal("Rotate did not renew a certificate 25 days from its end")
		}
		time.Sleep(5 * time.Millisecond)
	}
	renewed := serving(t, s.CertDir)
	if _, err := renewed.Verify(x509.VerifyOptions{DNSName: "svc.ns.svc", Roots: trusted, CurrentTime: late}); err != nil {
		t.Errorf("the renewed certificate does not verify against the caBundle injected before: %v", err)
	}
	cancel()
	<-rotating // no renewal of its own may race with the one below

	// A Secret written before the CA key was kept: the renewal makes a
	// new CA and injects it.
	var sec corev1.Secret
	if err := cl.Get(context.Background(), s.Secret, &sec); err != nil {
		t.Fatal(err)
	}
	delete(sec.Data, caKeyKey)
	if err := cl.Update(context.Background(), &sec); err != nil {
		t.Fatal(err)
	}
	now.Store(late.Add(340 * 24 * time.Hour).UnixNano())
	if err := s.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := serving(t, s.CertDir).Verify(x509.VerifyOptions{DNSName: "svc.ns.svc", Roots: bundle(), CurrentTime: time.Unix(0, now.Load())}); err != nil {
		t.Errorf("after a renewal with a new CA: %v", err)
	}
}
