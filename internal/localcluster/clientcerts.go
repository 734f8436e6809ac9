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

// clientCerts are a client certificate of the apiserver and the CA that
// signed it, which the server it calls trusts. The apiserver needs the
// files at start, before envtest's own client CA exists, so each gets a
// CA of its own.
type clientCerts struct {
	CAFile, CertFile, KeyFile string
}

// kubeletClientUser is the apiserver's user name at kubelets; kubelet asks
// the apiserver (Webhook authorization) whether it may, and the group
// system:masters says yes.
const kubeletClientUser = "kube-apiserver-kubelet-client"

// writeKubeletClientCerts writes the CA and the apiserver's certificate
// for kubelets (exec, logs, port-forward, the /proxy subresources), which
// every kubelet trusts, into dir.
func writeKubeletClientCerts(dir string) (clientCerts, error) {
	return writeClientCerts(dir, "kubelet-client", kubeletClientUser, []string{"system:masters"})
}

// writeClientCerts writes into dir a CA (NAME-ca.crt) and the apiserver's
// client certificate it signed (apiserver-NAME.crt, .key) for user in
// groups.
func writeClientCerts(dir, name, user string, groups []string) (clientCerts, error) {
	out := clientCerts{
		CAFile:   filepath.Join(dir, name+"-ca.crt"),
		CertFile: filepath.Join(dir, "apiserver-"+name+".crt"),
		KeyFile:  filepath.Join(dir, "apiserver-"+name+".key"),
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return out, fmt.Errorf("generating the %s CA's key: %w", name, err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "ebb local cluster " + name + " CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return out, fmt.Errorf("signing the %s CA: %w", name, err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return out, fmt.Errorf("reading the %s CA back: %w", name, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return out, fmt.Errorf("generating the apiserver's %s key: %w", name, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: user, Organization: groups},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return out, fmt.Errorf("signing the apiserver's %s certificate: %w", name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return out, fmt.Errorf("encoding the apiserver's %s key: %w", name, err)
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

// webhookClientUser is the apiserver's name in its client certificate for
// admission webhooks.
const webhookClientUser = "kube-apiserver"

// webhookClientHosts are the webhooks the apiserver presents its client
// certificate to: ebb's, in ebb-system (a kubeconfig user named after a
// Service's DNS name, wildcards allowed).
const webhookClientHosts = "*.ebb-system.svc"

// writeWebhookClientConfig writes into dir the apiserver's client
// certificate for ebb's admission webhooks and its CA (which ebb
// controller's --webhook-client-ca-file takes), the kubeconfig that names
// them, and the admission configuration
// (--admission-control-config-file) that gives it to both webhook
// admission plugins. It returns the configuration's path and the files.
func writeWebhookClientConfig(dir string) (config string, certs clientCerts, err error) {
	certs, err = writeClientCerts(dir, "webhook-client", webhookClientUser, nil)
	if err != nil {
		return "", certs, err
	}
	kubeconfig := filepath.Join(dir, "webhook-client.kubeconfig")
	config = filepath.Join(dir, "admission.yaml")
	files := map[string]string{
		kubeconfig: fmt.Sprintf(`apiVersion: v1
kind: Config
users:
- name: %q
  user:
    client-certificate: %s
    client-key: %s
`, webhookClientHosts, certs.CertFile, certs.KeyFile),
		config: fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %[1]s
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %[1]s
`, kubeconfig),
	}
	for path, data := range files {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			return "", certs, fmt.Errorf("writing %s: %w", path, err)
		}
	}
	return config, certs, nil
}
