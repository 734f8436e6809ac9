//go:build ebb_image

package main

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"testing"
)

// TestImageTrustsPublicRootsWithoutACABundle: the image has no CA file, so
// the binary must trust the public roots (the Azure API's chain, a user's
// webhook) on its own. Run with the image's tag: make unit does.
func TestImageTrustsPublicRootsWithoutACABundle(t *testing.T) {
	if os.Getenv("EBB_ROOTS_CHILD") == "1" {
		verifyPublicRoot(t)
		return
	}
	// Go loads the system roots once per process: check in a process of
	// its own that sees, as in the image, no bundle anywhere the standard
	// library looks, so nothing run before can have loaded the host's.
	cmd := exec.Command(os.Args[0], "-test.run=^TestImageTrustsPublicRootsWithoutACABundle$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "EBB_ROOTS_CHILD=1", "SSL_CERT_FILE=/nonexistent/ca-certificates.crt", "SSL_CERT_DIR=/nonexistent")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("without a CA bundle: %v\n%s", err, out)
	}
}

// verifyPublicRoot: Let's Encrypt's root verifies only if the binary
// carries it.
func verifyPublicRoot(t *testing.T) {
	data, err := os.ReadFile("testdata/isrg-root-x1.pem")
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatal("testdata/isrg-root-x1.pem holds no certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{}); err != nil {
		t.Fatalf("a public root does not verify without a CA bundle: %v", err)
	}
}
