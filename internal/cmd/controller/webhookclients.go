package controller

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"slices"

	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// clientCertsVerified returns the webhook server's TLS option that checks
// a caller's client certificate against the CAs of caFile: the API
// server's, configured to present one to ebb's webhooks (its
// --admission-control-config-file, docs/security.md). A certificate of
// another CA fails the handshake; a caller without one gets through the
// handshake (the readiness check, which has none, makes one) and is then
// refused by every handler (clientCertsRequired). The file is read once,
// here: a new CA needs a restart, as the API server's own configuration
// does.
func clientCertsVerified(caFile string) (func(*tls.Config), error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--webhook-client-ca-file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--webhook-client-ca-file %s: no PEM certificate in it (want the CA that signed the API server's client certificate for webhooks)", caFile)
	}
	return func(c *tls.Config) {
		c.ClientAuth = tls.VerifyClientCertIfGiven
		c.ClientCAs = pool
	}, nil
}

// clientCertsRequired is a webhook server whose every handler answers 403
// to a caller without a verified client certificate whose common name is
// one of Names (any, when empty): without it, anyone who reaches port 9443
// (any pod, by default) could send AdmissionReviews, each costing up to
// 101 SubjectAccessReviews of the controller's API budget. The names guard
// against a CA that signs more than the API server's certificate (a
// cluster CA signs every kubelet's and user's).
type clientCertsRequired struct {
	webhook.Server
	Names []string
}

func (s clientCertsRequired) Register(path string, hook http.Handler) {
	s.Server.Register(path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
			http.Error(w, "a client certificate of the CA in ebb controller's --webhook-client-ca-file is required", http.StatusForbidden)
			return
		}
		if cn := r.TLS.VerifiedChains[0][0].Subject.CommonName; len(s.Names) > 0 && !slices.Contains(s.Names, cn) {
			http.Error(w, fmt.Sprintf("the client certificate's common name %q is not one of ebb controller's --webhook-client-names", cn), http.StatusForbidden)
			return
		}
		hook.ServeHTTP(w, r)
	}))
}
