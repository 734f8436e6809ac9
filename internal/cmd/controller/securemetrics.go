package controller

import (
	"context"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ebbdev/ebb/internal/securemetrics"
)

// addSecureMetrics serves the controller's metrics (controller-runtime's
// registry, where ebb's are too) on --secure-metrics-bind-address, on
// every replica, when it is set.
func (o *Options) addSecureMetrics(ctx context.Context, mgr manager.Manager, cfg *rest.Config) error {
	if o.SecureMetricsAddress == "" {
		return nil
	}
	log := logr.FromContextOrDiscard(ctx).WithName("secure-metrics")
	handler, err := securemetrics.Handler(log, cfg, metrics.Registry)
	if err != nil {
		return err
	}
	tlsConfig, err := securemetrics.TLSConfig()
	if err != nil {
		return err
	}
	log.Info("Serving metrics to authorized callers", "address", o.SecureMetricsAddress)
	return mgr.Add(securemetrics.Server{Address: o.SecureMetricsAddress, Handler: handler, TLS: tlsConfig})
}
