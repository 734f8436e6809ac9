// Package nodeagent implements `ebb node-agent`: the KEP-3836 node health
// server for one node, run as a DaemonSet where kube-proxy does not serve
// it (or to serve it on another port).
package nodeagent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ebbdev/ebb/internal/cmd/kubeconfig"
	"github.com/ebbdev/ebb/internal/cmd/leavingflag"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/nodehealth"
	"github.com/ebbdev/ebb/internal/securemetrics"
)

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// Options are `ebb node-agent`'s flags.
type Options struct {
	Kubeconfig     string
	NodeName       string
	BindAddress    string
	MetricsAddress string
	// SecureMetricsAddress serves /metrics over HTTPS to callers the API
	// server authorizes; empty turns it off.
	SecureMetricsAddress string
	// StateFile keeps the node's last known state across restarts.
	StateFile string
	// Model says which signals make the node leaving: the same as the
	// controller's and ebb lb's.
	Model lbmodel.Options
}

// NewCommand returns `ebb node-agent`.
func NewCommand() *cobra.Command {
	o := &Options{}
	zapOpts := zap.Options{}
	cmd := &cobra.Command{
		Use:   "node-agent",
		Short: "Serve a node's /healthz and /livez for load-balancer health checks (KEP-3836)",
		Long: `Serve KEP-3836's node health endpoints for one node: GET /healthz answers
503 once the node is being deleted or carries a leaving signal (the cluster
autoscaler's ToBeDeletedByClusterAutoscaler as kube-proxy, and the others of
--leaving-signals-file: a NodeMaintenance's, out-of-service, Karpenter's,
medik8s' by default), so load balancers, ebb's or any other health-checking
node ports, stop sending it new connections first; GET /livez answers
200 while the process runs. The last known node state stays when the API
cannot be read.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.NodeName == "" {
				return errors.New("--node-name is required (in a DaemonSet, from the downward API: spec.nodeName)")
			}
			ctx := logr.NewContext(cmd.Context(), zap.New(zap.UseFlagOptions(&zapOpts)))
			return o.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, then $KUBECONFIG)")
	f.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "the node to answer for (default $NODE_NAME)")
	f.StringVar(&o.BindAddress, "bind-address", fmt.Sprintf(":%d", nodehealth.AgentPort), "address serving /healthz and /livez")
	f.StringVar(&o.MetricsAddress, "metrics-bind-address", "127.0.0.1:9465", "address serving /metrics, unauthenticated (empty: off); the default is reachable from this host only")
	f.StringVar(&o.SecureMetricsAddress, "secure-metrics-bind-address", "", "address serving /metrics over HTTPS (a self-signed certificate) to callers whose token the API server authenticates and allows GET on /metrics, e.g. Prometheus through a ServiceMonitor (empty: off)")
	f.BoolVar(&o.Model.IgnoreAutoscalerTaint, "ignore-autoscaler-taint", false, "do not treat ToBeDeletedByClusterAutoscaler as leaving (set it as on ebb lb)")
	leavingflag.Add(f, &o.Model.LeavingSignals)
	f.StringVar(&o.StateFile, "state-file", "", "file that keeps the node's last known state across restarts, so that an agent restarted while the API server is unreachable answers as it did (empty: start as eligible until the node is read)")
	logFlags := flag.NewFlagSet("log", flag.ContinueOnError)
	zapOpts.BindFlags(logFlags)
	f.AddGoFlagSet(logFlags)
	return cmd
}

// Run serves until ctx is done.
func (o *Options) Run(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx)
	cfg, err := kubeconfig.Load(o.Kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	reg := prometheus.NewRegistry()
	m, err := nodehealth.NewMetrics(reg)
	if err != nil {
		return err
	}
	srv := nodehealth.New(m, nil, o.Model)
	o.restoreState(log, srv)

	// Watch only this node; the informer keeps the last state across watch
	// errors, which is what KEP-3836 asks.
	factory := informers.NewSharedInformerFactoryWithOptions(client, 10*time.Minute,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", o.NodeName).String()
		}))
	setNode := func(n *corev1.Node) {
		if err := srv.SetNode(n); err != nil {
			log.Error(err, "Saving the node's state for a restart failed; serving it from memory", "node", o.NodeName)
		}
	}
	inf := factory.Core().V1().Nodes().Informer()
	if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		// The last known state stays: an API outage must not fail every
		// node's health check at once.
		log.Error(err, "Watching the node failed; keeping its last known state", "node", o.NodeName)
	}); err != nil {
		return fmt.Errorf("setting the watch error handler: %w", err)
	}
	_, err = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { setNode(obj.(*corev1.Node)) },
		UpdateFunc: func(_, obj any) { setNode(obj.(*corev1.Node)) },
		DeleteFunc: func(any) { setNode(nil) },
	})
	if err != nil {
		return fmt.Errorf("watching node %s: %w", o.NodeName, err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()

	servers := []*http.Server{newServer(o.BindAddress, srv.Handler(), idleTimeout)}
	if o.MetricsAddress != "" {
		servers = append(servers, newServer(o.MetricsAddress, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), idleTimeout))
	}
	if o.SecureMetricsAddress != "" {
		handler, err := securemetrics.Handler(log, cfg, reg)
		if err != nil {
			return err
		}
		tlsConfig, err := securemetrics.TLSConfig()
		if err != nil {
			return err
		}
		secure := securemetrics.NewServer(handler, tlsConfig)
		defer secure.Close()
		// Metrics are not worth the node's health: a port taken is
		// retried, and /healthz keeps answering meanwhile.
		go serveWhenFree(ctx, log, secure, o.SecureMetricsAddress)
	}
	errs := make(chan error, len(servers))
	for _, s := range servers {
		ln, err := net.Listen("tcp", s.Addr)
		if err != nil {
			return fmt.Errorf("listening on %s: %w", s.Addr, err)
		}
		go func() { errs <- s.Serve(ln) }()
		defer s.Close()
	}
	log.Info("Serving node health", "node", o.NodeName, "address", o.BindAddress)
	select {
	case <-ctx.Done():
		return nil
	case err := <-errs:
		return fmt.Errorf("serving: %w", err)
	}
}

// serveWhenFree serves the metrics over TLS on address once it can listen
// there, trying every 5 s until ctx is done; the first failure is logged.
func serveWhenFree(ctx context.Context, log logr.Logger, srv *http.Server, address string) {
	logged := false
	for {
		ln, err := securemetrics.Listen(address)
		if err == nil {
			log.Info("Serving metrics to authorized callers", "address", address)
			_ = securemetrics.Serve(srv, ln)
			return
		}
		if !logged {
			log.Error(err, "Cannot serve the metrics over HTTPS yet; trying again every 5 s", "address", address)
			logged = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}

// restoreState starts srv from the state saved before a restart, or says
// that it answers as eligible until it reads the node.
func (o *Options) restoreState(log logr.Logger, srv *nodehealth.Server) {
	if o.StateFile == "" {
		log.Info("Answering /healthz as eligible until the node is read (no --state-file)", "node", o.NodeName)
		return
	}
	srv.SaveTo(nodehealth.FileSaver(o.StateFile))
	st, ok, err := nodehealth.LoadState(o.StateFile)
	switch {
	case err != nil:
		log.Error(err, "Answering /healthz as eligible until the node is read", "node", o.NodeName)
	case !ok:
		log.Info("No saved state: answering /healthz as eligible until the node is read", "node", o.NodeName)
	default:
		srv.Restore(st)
		log.Info("Answering /healthz from the state saved before the restart until the node is read", "node", o.NodeName, "eligible", st.Eligible, "seen", st.LastUpdated)
	}
}

// idleTimeout closes a keep-alive connection that sends no next request:
// every LB host polls the agent, and an idle connection must not be held
// forever (net/http has no idle timeout unless one is set).
const idleTimeout = 30 * time.Second

// newServer bounds what one client can hold: the time to send a request's
// headers and body, to read the answer, and to stay connected idle.
func newServer(addr string, h http.Handler, idle time.Duration) *http.Server {
	return &http.Server{Addr: addr, Handler: h,
		ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
		IdleTimeout: idle, MaxHeaderBytes: 16 << 10}
}
