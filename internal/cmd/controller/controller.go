// Package controller implements `ebb controller`: today the Service
// load-balancer controller; the spot, node maintenance and evacuation
// controllers join it in later issues.
package controller

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ebbdev/ebb/internal/cmd/kubeconfig"
	"github.com/ebbdev/ebb/internal/controller/adminstate"
	"github.com/ebbdev/ebb/internal/controller/service"
	"github.com/ebbdev/ebb/internal/controller/spot"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// Options are `ebb controller`'s flags.
type Options struct {
	Kubeconfig          string
	LoadBalancerClass   string
	DefaultLoadBalancer bool
	VIPPools            []string
	LeaderElect         bool
	LeaderElectionNS    string
	MetricsAddress      string
	HealthAddress       string
	// SpotTaintKey is the draining taint a spot preemption adds; empty
	// turns the spot controller off.
	SpotTaintKey string
	// Model holds the admin-state rules (the same flags as `ebb lb`).
	Model lbmodel.Options
	// QPS and Burst bound the requests to the apiserver.
	QPS   float32
	Burst int
}

// NewCommand returns `ebb controller`.
func NewCommand() *cobra.Command {
	o := &Options{}
	zapOpts := zap.Options{}
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run ebb's controllers (Service load balancers, the spot preemption signal)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := kubeconfig.Load(o.Kubeconfig)
			if err != nil {
				return err
			}
			ctx := logr.NewContext(cmd.Context(), zap.New(zap.UseFlagOptions(&zapOpts)))
			return o.Run(ctx, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, then $KUBECONFIG)")
	f.StringVar(&o.LoadBalancerClass, "load-balancer-class", lbmodel.ClassL4, "spec.loadBalancerClass of the Services to serve")
	f.BoolVar(&o.DefaultLoadBalancer, "default-load-balancer", false, "also serve LoadBalancer Services that set no class")
	f.StringSliceVar(&o.VIPPools, "vip-pool", nil, "CIDR of load-balancer addresses to allocate from (repeatable; IPv4 and IPv6)")
	f.BoolVar(&o.LeaderElect, "leader-elect", true, "elect a leader so that only one replica acts")
	f.StringVar(&o.LeaderElectionNS, "leader-election-namespace", "", "namespace of the leader election lease (default: the pod's)")
	f.StringVar(&o.MetricsAddress, "metrics-bind-address", ":8080", "address serving /metrics (0 turns it off)")
	f.StringVar(&o.HealthAddress, "health-probe-bind-address", ":8081", "address serving /healthz and /readyz")
	f.StringVar(&o.SpotTaintKey, "spot-taint-key", lbmodel.TaintDraining, "taint added to a node on its first PreemptScheduled event (cloudprovider.azure.microsoft.com/draining on Azure); empty turns this off")
	f.BoolVar(&o.Model.IgnoreAutoscalerTaint, "ignore-autoscaler-taint", false, "do not treat ToBeDeletedByClusterAutoscaler as leaving (set it as on ebb lb)")
	f.BoolVar(&o.Model.AdminStateDisabled, "disable-admin-state", false, "admin state off (set it as on ebb lb): no admin-state events")
	f.Float32Var(&o.QPS, "kube-api-qps", 50, "requests per second to the apiserver")
	f.IntVar(&o.Burst, "kube-api-burst", 100, "burst of requests to the apiserver")
	logFlags := flag.NewFlagSet("log", flag.ContinueOnError)
	zapOpts.BindFlags(logFlags)
	f.AddGoFlagSet(logFlags)
	return cmd
}

// Run runs the controllers against cfg until ctx is done.
func (o *Options) Run(ctx context.Context, cfg *rest.Config) error {
	if o.LoadBalancerClass == "" {
		return errors.New("--load-balancer-class must not be empty")
	}
	ipam, err := service.NewAllocator(o.VIPPools)
	if err != nil {
		return err
	}
	ctrl.SetLogger(logr.FromContextOrDiscard(ctx))
	cfg = rest.CopyConfig(cfg)
	if o.QPS > 0 {
		cfg.QPS, cfg.Burst = o.QPS, o.Burst
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Metrics:                 metricsserver.Options{BindAddress: o.MetricsAddress},
		HealthProbeBindAddress:  o.HealthAddress,
		LeaderElection:          o.LeaderElect,
		LeaderElectionID:        "ebb-controller",
		LeaderElectionNamespace: o.LeaderElectionNS,
		// Only the spot preemption signal matters among Events: do not
		// cache the others.
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Event{}: {Field: fields.OneTermEqualSelector("reason", spot.ReasonPreemptScheduled)},
		}},
	})
	if err != nil {
		return fmt.Errorf("creating the controller manager: %w", err)
	}
	m, err := service.NewMetrics(metrics.Registry, ipam)
	if err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	r := &service.Reconciler{
		Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ebb-service-controller"),
		Class: o.LoadBalancerClass, DefaultLoadBalancer: o.DefaultLoadBalancer, IPAM: ipam, Metrics: m,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the service controller: %w", err)
	}
	if o.SpotTaintKey != "" {
		sr := &spot.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ebb-spot-controller"), TaintKey: o.SpotTaintKey}
		if err := sr.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up the spot preemption controller: %w", err)
		}
	}
	ar := &adminstate.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ebb-adminstate-controller"), Model: o.Model}
	if err := ar.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the admin state events: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	return mgr.Start(ctx)
}
