package localcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// kubeletClientCerts are the apiserver's client certificate for kubelets
// (exec, logs, port-forward, the /proxy subresources) and the CA that
// signed it, which every kubelet trusts. The apiserver needs the files at
// start, before envtest's own client CA exists, so they get a CA of their
// own.
type kubeletClientCerts struct {
	CAFile, CertFile, KeyFile string
}

// kubeletClientUser is the apiserver's user name at kubelets; kubelet asks
// the apiserver (Webhook authorization) whether it may, and the group
// system:masters says yes.
const kubeletClientUser = "kube-apiserver-kubelet-client"

// writeKubeletClientCerts writes the CA and the apiserver's certificate
// into dir.
func writeKubeletClientCerts(dir string) (kubeletClientCerts, error) {
	out := kubeletClientCerts{
		CAFile:   filepath.Join(dir, "kubelet-client-ca.crt"),
		CertFile: filepath.Join(dir, "apiserver-kubelet-client.crt"),
		KeyFile:  filepath.Join(dir, "apiserver-kubelet-client.key"),
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return out, fmt.Errorf("generating the kubelet client CA's key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "ebb local cluster kubelet client CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return out, fmt.Errorf("signing the kubelet client CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return out, fmt.Errorf("reading the kubelet client CA back: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return out, fmt.Errorf("generating the apiserver's kubelet client key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: kubeletClientUser, Organization: []string{"system:masters"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return out, fmt.Errorf("signing the apiserver's kubelet client certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return out, fmt.Errorf("encoding the apiserver's kubelet client key: %w", err)
	}
	files := map[string][]byte{
		out.CAFile:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		out.CertFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		out.KeyFile:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
	for path, data := range files {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return out, fmt.Errorf("writing %s: %w", path, err)
		}
	}
	return out, nil
}
