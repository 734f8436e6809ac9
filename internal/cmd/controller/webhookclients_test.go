package controller

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// testCA signs certificates for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate and key in PEM, for a server (at 127.0.0.1)
// or a client.
func (ca *testCA) issue(t *testing.T, name string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// With --webhook-client-ca-file, the webhook server answers only callers
// with a client certificate of that CA, as the API server presents one
// (issue 42 item 4: any pod could send AdmissionReviews); its readiness
// check, which has no certificate, still passes.
func TestWebhookServerRequiresTheAPIServersClientCertificate(t *testing.T) {
	dir := t.TempDir()
	serving, apiserverCA, otherCA := newTestCA(t, "serving CA"), newTestCA(t, "API server's webhook client CA"), newTestCA(t, "another CA")
	crt, key := serving.issue(t, "webhook", true)
	caFile := filepath.Join(dir, "client-ca.crt")
	for path, data := range map[string][]byte{filepath.Join(dir, "tls.crt"): crt, filepath.Join(dir, "tls.key"): key, caFile: apiserverCA.pem} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	verify, err := clientCertsVerified(caFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	srv := clientCertsRequired{Names: []string{"kube-apiserver"},
		Server: webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: dir, TLSOpts: []func(*tls.Config){onlyHTTP1, verify}})}
	srv.Register("/review", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "reviewed") }))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = srv.Start(ctx) }()
	ready := srv.StartedChecker()
	deadline := time.Now().Add(10 * time.Second)
	for err := ready(nil); err != nil; err = ready(nil) {
		if time.Now().After(deadline) {
			t.Fatalf("the readiness check never passed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(serving.pem)
	post := func(certs []tls.Certificate) (int, string, error) {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs}}}
		resp, err := c.Post("https://127.0.0.1:"+strconv.Itoa(port)+"/review", "application/json", strings.NewReader("{}"))
		if err != nil {
			return 0, "", err
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	pair := func(ca *testCA, name string) []tls.Certificate {
		crt, key := ca.issue(t, name, false)
		c, err := tls.X509KeyPair(crt, key)
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{c}
	}
	for _, c := range []struct {
		name  string
		certs []tls.Certificate
		code  int
	}{
		{"no client certificate (a pod)", nil, http.StatusForbidden},
		// The server names the CAs it accepts; a client whose certificate
		// is of none of them sends none.
		{"a certificate of another CA", pair(otherCA, "kube-apiserver"), http.StatusForbidden},
		{"the API server's certificate", pair(apiserverCA, "kube-apiserver"), http.StatusOK},
		// The CA signed it, but it is not the API server's (a CA that
		// signs kubelets' or users' certificates too).
		{"another name from the CA", pair(apiserverCA, "system:node:node-1"), http.StatusForbidden},
	} {
		code, body, err := post(c.certs)
		if err != nil || code != c.code || (code == http.StatusOK) != (body == "reviewed") {
			t.Errorf("%s: %d %q, %v; want status %d", c.name, code, body, err, c.code)
		}
	}
}

// A CA file that cannot be read, or holds no certificate, stops the
// controller at start with what to give.
func TestWebhookClientCAFileErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.crt")
	if err := os.WriteFile(empty, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		filepath.Join(dir, "missing.crt"): "no such file",
		empty:                             "no PEM certificate in it",
	} {
		if _, err := clientCertsVerified(file); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", filepath.Base(file), err, want)
		}
	}
}
