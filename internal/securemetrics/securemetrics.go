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
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"
	"golang.org/x/time/rate"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
)

// The API calls each request costs (RBAC for every component that serves
// them: make generate adds this package to their roles' paths).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Bounds on what callers may cost before the API server has said who they
// are: every new token costs a TokenReview (cached only for tokens seen
// before), which an unauthenticated client could send by the thousand.
const (
	// maxAuthorization bounds the Authorization header (a service
	// account's token is about 1 KiB).
	maxAuthorization = 4 << 10
	// reviewsPerSecond and reviewBurst bound the requests that reach the
	// authentication filter: a Prometheus scrapes every 15 to 60 s.
	reviewsPerSecond = 5
	reviewBurst      = 20
	// MaxConnections bounds the connections a listener holds at once
	// (Listen).
	MaxConnections = 32
)

// Handler serves gatherer at /metrics (and nothing else) to callers whose
// bearer token cfg's API server authenticates and authorizes. Requests
// beyond reviewsPerSecond get 429 and an Authorization header over
// maxAuthorization gets 431, before any API call.
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
	return bounded(h, rate.NewLimiter(reviewsPerSecond, reviewBurst)), nil
}

// bounded refuses what would cost next an API call beyond limiter, and
// oversized credentials.
func bounded(next http.Handler, limiter *rate.Limiter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.Header.Get("Authorization")) > maxAuthorization {
			http.Error(w, "Authorization header too large", http.StatusRequestHeaderFieldsTooLarge)
			return
		}
		if !limiter.Allow() {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "too many requests", http.StatusTooManyRequests)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Listen listens on address for the metrics, holding at most
// MaxConnections at once. address may be "HOST:PORT" with an IPv6 HOST
// unbracketed, as "$(NODE_IP):9474" becomes in a pod's arguments on an
// IPv6 node.
func Listen(address string) (net.Listener, error) {
	ln, err := net.Listen("tcp", NormalizeAddress(address))
	if err != nil {
		return nil, err
	}
	return netutil.LimitListener(ln, MaxConnections), nil
}

// NormalizeAddress brackets an unbracketed IPv6 host of address
// ("fd00::1:9474" to "[fd00::1]:9474"); any other address is returned as
// it is.
func NormalizeAddress(address string) string {
	if _, _, err := net.SplitHostPort(address); err == nil {
		return address
	}
	i := strings.LastIndexByte(address, ':')
	if i < 0 {
		return address
	}
	if ip := net.ParseIP(address[:i]); ip != nil && ip.To4() == nil {
		return net.JoinHostPort(address[:i], address[i+1:])
	}
	return address
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
	ln, err := Listen(s.Address)
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
