// Package securemetrics serves a component's Prometheus metrics where a
// scraper from another pod can reach them, to callers the API server
// vouches for: HTTPS with a self-signed certificate made at start, and
// every request's bearer token authenticated by a TokenReview and
// authorized by a SubjectAccessReview for GET on the non-resource URL
// /metrics (controller-runtime's filter, as kubebuilder's projects and
// kube-rbac-proxy do). A ServiceMonitor scrapes it with its service
// account's token; anyone else gets 401 or 403. The unauthenticated
// loopback listeners stay for probes and port-forwards.
package securemetrics

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
)

// The API calls each request costs (RBAC for every component that serves
// them: make generate adds this package to their roles' paths).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Handler serves gatherer at /metrics (and nothing else) to callers whose
// bearer token cfg's API server authenticates and authorizes.
func Handler(log logr.Logger, cfg *rest.Config, gatherer prometheus.Gatherer) (http.Handler, error) {
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("making the API client of the metrics' authentication: %w", err)
	}
	filter, err := filters.WithAuthenticationAndAuthorization(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("making the metrics' authentication: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	h, err := filter(log, mux)
	if err != nil {
		return nil, fmt.Errorf("wrapping the metrics in their authentication: %w", err)
	}
	return h, nil
}

// TLSConfig is a server configuration with a self-signed certificate for
// this host's name, made now and held in memory (the root file system is
// read-only): scrapers skip its verification, as they do for
// kubebuilder's, or cert-manager's certificate would be mounted instead.
func TLSConfig() (*tls.Config, error) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("making the metrics' self-signed certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("loading the metrics' self-signed certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// NewServer is an HTTPS server of handler with tlsConfig, with timeouts
// that bound what a slow or idle client holds.
func NewServer(handler http.Handler, tlsConfig *tls.Config) *http.Server {
	return &http.Server{
		Handler:           handler,
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    16 << 10,
	}
}

// Serve serves srv over TLS on ln until srv is closed.
func Serve(srv *http.Server, ln net.Listener) error {
	return srv.Serve(tls.NewListener(ln, srv.TLSConfig))
}

// Server serves Handler over TLS on Address until Start's context ends. As
// a controller-runtime Runnable, every replica runs it, leader or not.
type Server struct {
	Address string
	Handler http.Handler
	TLS     *tls.Config
}

// Start listens on s.Address and serves until ctx is done.
func (s Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.Address)
	if err != nil {
		return fmt.Errorf("listening for metrics on %s: %w", s.Address, err)
	}
	srv := NewServer(s.Handler, s.TLS)
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
		case <-stopped:
		}
		_ = srv.Close()
	}()
	if err := Serve(srv, ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving metrics on %s: %w", s.Address, err)
	}
	return nil
}

// NeedLeaderElection is false: every replica serves its own metrics.
func (Server) NeedLeaderElection() bool { return false }
