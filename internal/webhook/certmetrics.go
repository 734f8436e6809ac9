package webhook

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterCertificateExpiry registers ebb_webhook_certificate_expiry_timestamp_seconds:
// when the serving certificate in certFile (tls.crt of --webhook-cert-dir,
// written by SelfSignedCerts or by cert-manager) expires, read at each
// scrape so that a renewal shows at once. 0 while the file cannot be read
// or holds no certificate: an alert on a near expiry fires then too.
func RegisterCertificateExpiry(reg prometheus.Registerer, certFile string) error {
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ebb_webhook_certificate_expiry_timestamp_seconds",
		Help: "When the webhook's serving certificate expires (Unix time); 0 while it cannot be read.",
	}, func() float64 {
		notAfter, err := certificateExpiry(certFile)
		if err != nil {
			return 0
		}
		return float64(notAfter)
	}))
}

// certificateExpiry is the NotAfter, in Unix seconds, of the first
// certificate in the PEM file.
func certificateExpiry(file string) (int64, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("reading the webhook's certificate: %w", err)
	}
	block, _ := pem.Decode(raw)
	if block == nil || block.Type != "CERTIFICATE" {
		return 0, errors.New("the webhook's certificate file holds no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return 0, fmt.Errorf("parsing the webhook's certificate: %w", err)
	}
	return cert.NotAfter.Unix(), nil
}
