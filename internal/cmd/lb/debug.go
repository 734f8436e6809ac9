package lb

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/rest"

	"github.com/ebbdev/ebb/internal/securemetrics"
)

// serveDebug serves /metrics, /healthz and /readyz (ready says when) on
// --metrics-bind-address, /metrics to callers cfg's API server authorizes
// on --secure-metrics-bind-address (cfg nil: no cluster), and pprof on
// --pprof-bind-address, when set; stop
// closes them. An address in use is taken as soon as it is free instead of
// failing: in a rolling update the old pod of the host (same host network)
// holds it until it hands over to this process. Until then /readyz does
// not answer for this process, so it is not ready.
func (o *Options) serveDebug(log logr.Logger, reg *prometheus.Registry, cfg *rest.Config, ready func() bool) (stop func(), err error) {
	var servers []*http.Server
	stopped := make(chan struct{})
	var once sync.Once
	stop = func() {
		once.Do(func() { close(stopped) })
		for _, srv := range servers {
			_ = srv.Close()
		}
	}
	// serveOn serves srv on address (over TLS when srv has a TLS
	// configuration).
	serveOn := func(what, address string, srv *http.Server) error {
		run := func(ln net.Listener) {
			if srv.TLSConfig != nil {
				_ = securemetrics.Serve(srv, ln)
				return
			}
			_ = srv.Serve(ln)
		}
		listen := func(address string) (net.Listener, error) { return net.Listen("tcp", address) }
		if srv.TLSConfig != nil {
			listen = securemetrics.Listen
		}
		ln, err := listen(address)
		if err != nil && errors.Is(err, syscall.EADDRINUSE) {
			servers = append(servers, srv)
			log.Info("Another process serves on the "+what+" address (the ebb lb this one takes over from?): serving "+what+" once it is free", "address", address)
			go listenWhenFree(listen, address, stopped, func(ln net.Listener) {
				log.Info("Serving "+what, "address", ln.Addr().String())
				run(ln)
			})
			return nil
		}
		if err != nil {
			return fmt.Errorf("listening for %s on %s: %w", what, address, err)
		}
		servers = append(servers, srv)
		go run(ln)
		log.Info("Serving "+what, "address", ln.Addr().String())
		return nil
	}
	serve := func(what, address string, mux *http.ServeMux) error {
		return serveOn(what, address, &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second})
	}
	if o.MetricsAddress != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			if !ready() {
				http.Error(w, "not serving: caches not synced, no configuration applied yet, the kernel engine failing under a frontend that names it (ebb_dataplane_frontend_skipped{reason=\"KernelFailed\"}), taking over from or handed over to another ebb lb on this host, or stopping", http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("ok\n"))
		})
		if err := serve("metrics", o.MetricsAddress, mux); err != nil {
			return stop, err
		}
	}
	if o.SecureMetricsAddress != "" {
		if cfg == nil {
			return stop, errors.New("--secure-metrics-bind-address needs the cluster, whose API server authenticates the callers: not with --config")
		}
		handler, err := securemetrics.Handler(log, cfg, reg)
		if err != nil {
			return stop, err
		}
		tlsConfig, err := securemetrics.TLSConfig()
		if err != nil {
			return stop, err
		}
		if err := serveOn("secure metrics", o.SecureMetricsAddress, securemetrics.NewServer(handler, tlsConfig)); err != nil {
			return stop, err
		}
	}
	if o.PprofAddress != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		if err := serve("pprof", o.PprofAddress, mux); err != nil {
			return stop, err
		}
	}
	return stop, nil
}

// listenWhenFree listens on address with listen as soon as it is free,
// then serves on it; it gives up when stopped closes first.
func listenWhenFree(listen func(string) (net.Listener, error), address string, stopped <-chan struct{}, serve func(net.Listener)) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stopped:
			return
		case <-tick.C:
		}
		if ln, err := listen(address); err == nil {
			serve(ln)
			return
		}
	}
}
