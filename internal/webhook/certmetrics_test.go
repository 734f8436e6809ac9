package webhook

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// The expiry gauge reads the serving certificate the webhook serves: a
// self-signed one's NotAfter (a year after it was made), the new one's
// after a renewal rewrote the file, and 0 when the file is unreadable.
func TestCertificateExpiryFollowsTheServingCertificate(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = corev1.AddToScheme(scheme)
	dir := t.TempDir()
	now := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	certs := &SelfSignedCerts{Client: fake.NewClientBuilder().WithScheme(scheme).Build(), Secret: types.NamespacedName{Namespace: "ebb-system", Name: "cert"},
		DNSNames: []string{"svc.ns.svc"}, CertDir: dir, Now: func() time.Time { return now }}
	if err := certs.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := RegisterCertificateExpiry(reg, filepath.Join(dir, "tls.crt")); err != nil {
		t.Fatal(err)
	}
	expiry := func() float64 {
		t.Helper()
		n, err := testutil.GatherAndCount(reg, "ebb_webhook_certificate_expiry_timestamp_seconds")
		if err != nil || n != 1 {
			t.Fatalf("gathering: %d series, %v", n, err)
		}
		mfs, _ := reg.Gather()
		return mfs[0].GetMetric()[0].GetGauge().GetValue()
	}
	if got, want := expiry(), float64(now.Add(servingLife).Unix()); got != want {
		t.Errorf("expiry %v, want %v (the serving certificate's NotAfter)", time.Unix(int64(got), 0).UTC(), time.Unix(int64(want), 0).UTC())
	}
	// A renewal rewrites the file; the next scrape reads the new one.
	now = now.Add(servingLife - renewBefore + time.Hour)
	if err := certs.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := expiry(), float64(now.Add(servingLife).Unix()); got != want {
		t.Errorf("after the renewal: expiry %v, want %v", time.Unix(int64(got), 0).UTC(), time.Unix(int64(want), 0).UTC())
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := expiry(); got != 0 {
		t.Errorf("expiry %v for a file with no certificate, want 0", got)
	}
}
