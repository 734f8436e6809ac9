// Package controller implements `ebb controller`: the Service
// load-balancer, spot, admin-state event and node maintenance controllers
// and the admission webhooks.
package controller

// The leader election's Lease, in ebb's namespace only
// (--leader-election-namespace).
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=ebb-system,resources=leases,verbs=create
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=ebb-system,resources=leases,verbs=get;update,resourceNames=ebb-controller

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/cmd/azurecmd"
	"github.com/ebbdev/ebb/internal/cmd/kubeconfig"
	"github.com/ebbdev/ebb/internal/cmd/leavingflag"
	"github.com/ebbdev/ebb/internal/cmd/podns"
	"github.com/ebbdev/ebb/internal/controller/adminstate"
	"github.com/ebbdev/ebb/internal/controller/announcestatus"
	"github.com/ebbdev/ebb/internal/controller/azureadminstate"
	"github.com/ebbdev/ebb/internal/controller/deletionhold"
	"github.com/ebbdev/ebb/internal/controller/evacuation"
	"github.com/ebbdev/ebb/internal/controller/l2key"
	"github.com/ebbdev/ebb/internal/controller/nodemaintenance"
	"github.com/ebbdev/ebb/internal/controller/service"
	"github.com/ebbdev/ebb/internal/controller/spot"
	"github.com/ebbdev/ebb/internal/controller/surge"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/provider/azure"
	ebbwebhook "github.com/ebbdev/ebb/internal/webhook"
)

// Options are `ebb controller`'s flags.
type Options struct {
	Kubeconfig          string
	LoadBalancerClass   string
	DefaultLoadBalancer bool
	// PublishAddressesAtOnce writes a Service's address to its status
	// when allocated, not once an LB host reports it served.
	PublishAddressesAtOnce bool
	VIPPools               []string
	LeaderElect            bool
	LeaderElectionNS       string
	MetricsAddress         string
	SecureMetricsAddress   string
	HealthAddress          string
	// L2KeySecret (namespace/name) is created with a random key for ebb
	// lb's L2 heartbeats when missing; empty: not managed.
	L2KeySecret string
	// SpotTaintKey is the draining taint a spot preemption adds; empty
	// turns the spot controller off.
	SpotTaintKey string
	// SpotEventSources are the emitters whose PreemptScheduled Events the
	// spot controller trusts.
	SpotEventSources []string
	// LBNamespace is where ebb lb's DaemonSet runs: its pods are the
	// replicas a missing LoadBalancerReport is compared with.
	LBNamespace string
	// EvictionGuard serves the eviction guard (webhook.EvictionGuard) to
	// the opt-in webhook configuration; EvictionGuardExempt are the users
	// whose evictions it lets through.
	EvictionGuard       bool
	EvictionGuardExempt []string
	// Model holds the admin-state rules (the same flags as `ebb lb`).
	Model lbmodel.Options
	// QPS and Burst bound the requests to the apiserver.
	QPS   float32
	Burst int
	// Cloud selects a provider that applies admin state through its API
	// ("azure"); empty: none (the embedded ebb lb applies it itself).
	Cloud       string
	AzureConfig string
	// AzureConfigSecret ("namespace/name"), when set, holds azure.json
	// instead of the AzureConfig file.
	AzureConfigSecret string
	// AzureMigrateOnStart runs the Basic-to-Standard migration once at
	// start when azure.json's loadBalancerSku is standard.
	AzureMigrateOnStart bool
	// SurgeEvacuator runs ebb's surge-first evacuator for opted-in
	// Deployments.
	SurgeEvacuator bool
	// MaxEvictionsInFlight bounds concurrent Evacuation reconciles.
	MaxEvictionsInFlight int
	// MaxDrainingNodes bounds the nodes NodeMaintenances drain at once
	// (0: no bound).
	MaxDrainingNodes int
	// DeletionHold keeps cluster-autoscaler's delay-deletion annotation
	// on nodes until the load balancers drained them (deletionhold);
	// DeletionHoldTimeout bounds a hold.
	DeletionHold        bool
	DeletionHoldTimeout time.Duration
	// Webhook serves admission; Port 0 turns it off.
	Webhook WebhookOptions
}

// WebhookOptions configure the admission webhook server.
type WebhookOptions struct {
	Port    int
	Host    string
	CertDir string
	// CertSecret ("namespace/name") holds a self-managed CA and serving
	// certificate; empty: the certificate is provided in CertDir (e.g. by
	// cert-manager).
	CertSecret string
	// ClientCAFile, when set, holds the CAs whose client certificates the
	// server requires of every caller (the API server's).
	ClientCAFile string
	// ClientNames are the common names of the client certificates
	// accepted (empty: any the CA signed).
	ClientNames []string
	DNSNames    []string
	IPs         []string
	Mutating    []string
	Validating  []string
}

// NewCommand returns `ebb controller`.
func NewCommand() *cobra.Command {
	o := &Options{}
	zapOpts := zap.Options{}
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run ebb's controllers (Service load balancers, the spot preemption signal, node maintenance) and admission webhooks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := kubeconfig.Load(o.Kubeconfig)
			if err != nil {
				return err
			}
			o.cloudDefaults(cmd.Flags().Changed)
			ctx := logr.NewContext(cmd.Context(), zap.New(zap.UseFlagOptions(&zapOpts)))
			return o.Run(ctx, cfg)
		},
	}
	f := cmd.Flags()
	// ebb's own objects are in the pod's namespace: the defaults below
	// name them there.
	ns := podns.Namespace()
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, then $KUBECONFIG)")
	f.StringVar(&o.LoadBalancerClass, "load-balancer-class", lbmodel.ClassL4, "spec.loadBalancerClass of the Services to serve")
	f.BoolVar(&o.DefaultLoadBalancer, "default-load-balancer", false, "also serve LoadBalancer Services that set no class")
	f.BoolVar(&o.PublishAddressesAtOnce, "publish-addresses-at-once", false, "write a Service's allocated address to status.loadBalancer.ingress at once, instead of once an ebb lb replica reports it served and announced (condition lb.ebb.dev/Served says which); for ebb lb replicas that run without --report-name")
	f.StringSliceVar(&o.VIPPools, "vip-pool", nil, "deprecated (use AddressPool objects, group lb.ebb.dev): CIDR of load-balancer addresses to allocate from after the AddressPools, to every Service; creates nothing in the API (repeatable; IPv4 and IPv6)")
	f.BoolVar(&o.LeaderElect, "leader-elect", true, "elect a leader so that only one replica acts")
	f.StringVar(&o.LeaderElectionNS, "leader-election-namespace", "", "namespace of the leader election lease (default: the pod's)")
	f.StringVar(&o.MetricsAddress, "metrics-bind-address", "127.0.0.1:8080", "address serving /metrics, unauthenticated (0 turns it off); the default is reachable from this host only")
	f.StringVar(&o.SecureMetricsAddress, "secure-metrics-bind-address", "", "address serving /metrics over HTTPS (a self-signed certificate) to callers whose token the API server authenticates and allows GET on /metrics, e.g. Prometheus through a ServiceMonitor (empty: off)")
	f.StringVar(&o.HealthAddress, "health-probe-bind-address", ":8081", "address serving /healthz and /readyz")
	f.StringVar(&o.SpotTaintKey, "spot-taint-key", lbmodel.TaintDraining, "taint added (value spot-eviction) to a node on its first PreemptScheduled event (default with --cloud azure: cloudprovider.azure.microsoft.com/draining, as cloud-provider-azure's design says); empty turns this off")
	f.StringSliceVar(&o.SpotEventSources, "spot-event-sources", spot.DefaultTrustedSources, "emitters (an Event's source.component or reportingController) whose PreemptScheduled Events about a Node are acted on; the Event must also be in namespace default or kube-system and name the Node without a namespace, which a namespace user cannot write")
	f.StringVar(&o.LBNamespace, "lb-namespace", ns, "namespace of the ebb-lb DaemonSet (default: $POD_NAMESPACE, else ebb-system): its running pods without a fresh LoadBalancerReport count as replicas whose state is unknown (drains wait for them, up to 30 s; the last load-balancer host is kept)")
	f.BoolVar(&o.Model.IgnoreAutoscalerTaint, "ignore-autoscaler-taint", false, "do not treat ToBeDeletedByClusterAutoscaler as leaving (set it as on ebb lb)")
	leavingflag.Add(f, &o.Model.LeavingSignals)
	f.BoolVar(&o.DeletionHold, "autoscaler-deletion-hold", false, "keep the annotation "+deletionhold.Annotation+" on every node in load-balancer rotation and remove it from a leaving node only once no load-balancer connection goes through it (or --deletion-hold-timeout passed): cluster-autoscaler waits for it before deleting the instance, up to its --node-deletion-delay-timeout (which starts once it has evicted the node's pods: docs/nodes-that-leave.md). Off: ebb removes its annotation from every node")
	f.DurationVar(&o.DeletionHoldTimeout, "deletion-hold-timeout", deletionhold.DefaultTimeout, "with --autoscaler-deletion-hold: release a leaving node's hold after this long even if connections remain")
	f.BoolVar(&o.Model.AdminStateDisabled, "disable-admin-state", false, "admin state off (set it as on ebb lb): no admin-state events")
	f.Float32Var(&o.QPS, "kube-api-qps", 50, "requests per second to the apiserver")
	f.IntVar(&o.Burst, "kube-api-burst", 100, "burst of requests to the apiserver")
	f.StringVar(&o.Cloud, "cloud", "", "apply load-balancer admin state through a cloud's API as well: azure")
	f.StringVar(&o.AzureConfig, "azure-config", "/etc/kubernetes/azure.json", "with --cloud azure: the azure.json file")
	f.StringVar(&o.AzureConfigSecret, "azure-config-secret", "", "with --cloud azure: read azure.json through the API from this Secret (namespace/name; key cloud-config, as cloud-provider-azure's kube-system/azure-cloud-provider, or azure.json) instead of --azure-config; outside ebb-system, ebb lb cannot read a client secret in it (config/components/azure-config-secret, docs/azure.md)")
	f.BoolVar(&o.AzureMigrateOnStart, "azure-migrate-on-start", false, "with --cloud azure and loadBalancerSku standard: run the Basic-to-Standard migration once at start (may cause downtime; see `ebb azure migrate-basic-lb --help`)")
	f.BoolVar(&o.SurgeEvacuator, "surge-evacuator", true, "run the surge-first evacuator for Deployments annotated "+v1alpha1.SurgeEvacuationAnnotation+": \"true\"")
	f.IntVar(&o.MaxEvictionsInFlight, "max-evictions-in-flight", 5, "Evacuations handled (and evictions sent) at once")
	f.IntVar(&o.MaxDrainingNodes, "max-draining-nodes", 0, "nodes NodeMaintenances drain at once across maintenances; a maintenance that would exceed it waits in Drain, cordoned, with condition Drained=False reason WaitingForDrainSlot (0: no limit)")
	f.BoolVar(&o.EvictionGuard, "eviction-guard", false, "serve the eviction guard at "+ebbwebhook.EvictionGuardPath+": evictions of pods that register evacuators are refused (429) until their evacuators had their turn (KEP-4212). Install config/components/eviction-guard to have the API server call it")
	f.StringSliceVar(&o.EvictionGuardExempt, "eviction-guard-exempt", []string{"system:serviceaccount:" + ns + ":ebb-controller"}, "users whose evictions the eviction guard lets through: ebb controller's own service account, whose Evacuation controller evicts when no evacuator is left")
	f.IntVar(&o.Webhook.Port, "webhook-port", 9443, "port of the admission webhook server (0 turns admission off: not for production)")
	f.StringVar(&o.Webhook.Host, "webhook-bind-host", "", "address the webhook server binds (default: all)")
	f.StringVar(&o.Webhook.CertDir, "webhook-cert-dir", filepath.Join(os.TempDir(), "ebb-webhook-certs"), "directory of the webhook's tls.crt and tls.key")
	f.StringVar(&o.Webhook.ClientCAFile, "webhook-client-ca-file", "", "PEM file of the CA(s) whose client certificates the webhook server requires of every caller: the API server's, which its --admission-control-config-file has it present to webhooks (config/components/webhook-client-auth, docs/security.md); empty: any caller that reaches the port is served")
	f.StringSliceVar(&o.Webhook.ClientNames, "webhook-client-names", []string{"kube-apiserver"}, "with --webhook-client-ca-file: the common names of the client certificates accepted (empty: any the CA signed; use a CA of its own for the API server's webhook client certificate)")
	f.StringVar(&o.L2KeySecret, "l2-key-secret", ns+"/ebb-l2-key", "Secret (namespace/name) of the keys that sign ebb lb's L2 heartbeats: created with one random key when missing, never changed once there (docs/l2.md); empty: you provide it")
	f.StringVar(&o.Webhook.CertSecret, "webhook-cert-secret", ns+"/ebb-webhook-cert", "Secret (namespace/name) in which ebb keeps a self-signed CA and serving certificate and injects the CA into the webhook configurations; empty when cert-manager (or you) put the certificate in --webhook-cert-dir")
	f.StringSliceVar(&o.Webhook.DNSNames, "webhook-dns-name", []string{"ebb-webhook-service." + ns + ".svc", "ebb-webhook-service." + ns + ".svc.cluster.local"}, "DNS names of the self-signed serving certificate")
	f.StringSliceVar(&o.Webhook.IPs, "webhook-ip-address", nil, "IP addresses of the self-signed serving certificate")
	f.StringSliceVar(&o.Webhook.Mutating, "webhook-mutating-configuration", []string{"ebb-mutating-webhook-configuration"}, "MutatingWebhookConfigurations to inject the self-signed CA into")
	f.StringSliceVar(&o.Webhook.Validating, "webhook-validating-configuration", []string{"ebb-validating-webhook-configuration"}, "ValidatingWebhookConfigurations to inject the self-signed CA into")
	logFlags := flag.NewFlagSet("log", flag.ContinueOnError)
	zapOpts.BindFlags(logFlags)
	f.AddGoFlagSet(logFlags)
	return cmd
}

// Run runs the controllers against cfg until ctx is done.
func (o *Options) Run(ctx context.Context, cfg *rest.Config) error {
	if err := lbmodel.ValidateClass(o.LoadBalancerClass); err != nil {
		return fmt.Errorf("--load-balancer-class: %w", err)
	}
	if o.MaxDrainingNodes < 0 {
		return fmt.Errorf("--max-draining-nodes %d: want 0 (no limit) or more", o.MaxDrainingNodes)
	}
	if err := o.checkFlagPairs(); err != nil {
		return err
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
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	if err := lbv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	mgrOpts := ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: o.MetricsAddress},
		HealthProbeBindAddress:  o.HealthAddress,
		LeaderElection:          o.LeaderElect,
		LeaderElectionID:        "ebb-controller",
		LeaderElectionNamespace: o.LeaderElectionNS,
		// Only the spot preemption signal matters among Events: do not
		// cache the others.
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Event{}: {Field: fields.OneTermEqualSelector("reason", lbmodel.ReasonPreemptScheduled)},
		}},
	}
	// Not cached, for what runs before the caches start or reads one
	// Secret by name: the webhook certificate and the L2 heartbeat key.
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	var certs *ebbwebhook.SelfSignedCerts
	if o.Webhook.Port != 0 {
		if certs, err = o.ensureWebhookCerts(ctx, direct); err != nil {
			return err
		}
		// tls.crt: controller-runtime's webhook server's default name.
		if err := ebbwebhook.RegisterCertificateExpiry(metrics.Registry, filepath.Join(o.Webhook.CertDir, "tls.crt")); err != nil {
			return fmt.Errorf("registering the webhook certificate's metric: %w", err)
		}
		tlsOpts := []func(*tls.Config){onlyHTTP1}
		if o.Webhook.ClientCAFile != "" {
			verify, err := clientCertsVerified(o.Webhook.ClientCAFile)
			if err != nil {
				return err
			}
			tlsOpts = append(tlsOpts, verify)
		}
		mgrOpts.WebhookServer = webhook.NewServer(webhook.Options{Port: o.Webhook.Port, Host: o.Webhook.Host, CertDir: o.Webhook.CertDir,
			TLSOpts: tlsOpts})
		if o.Webhook.ClientCAFile != "" {
			mgrOpts.WebhookServer = clientCertsRequired{Server: mgrOpts.WebhookServer, Names: o.Webhook.ClientNames}
		}
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		return fmt.Errorf("creating the controller manager: %w", err)
	}
	if certs != nil {
		if err := mgr.Add(certs.Rotate(webhookCertCheck)); err != nil {
			return err
		}
	}
	if err := o.keepL2Key(direct, mgr); err != nil {
		return err
	}
	if err := o.setupLoadBalancing(ctx, mgr, ipam); err != nil {
		return err
	}
	if err := o.setupMaintenance(ctx, mgr); err != nil {
		return err
	}
	if err := o.addSecureMetrics(ctx, mgr, cfg); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if o.Webhook.Port != 0 {
		if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
			return err
		}
	}
	return mgr.Start(ctx)
}

// webhookCertCheck is how often a running controller checks its
// self-managed webhook certificate (renewed 30 days before its end).
const webhookCertCheck = time.Hour

// ensureWebhookCerts provides the serving certificate in self-managed
// mode and returns its manager, to keep it renewed (nil when another tool
// provides it).
func (o *Options) ensureWebhookCerts(ctx context.Context, c client.Client) (*ebbwebhook.SelfSignedCerts, error) {
	if o.Webhook.CertSecret == "" {
		return nil, nil
	}
	secret, err := objectKeyFlag("webhook-cert-secret", o.Webhook.CertSecret)
	if err != nil {
		return nil, err
	}
	var ips []net.IP
	for _, s := range o.Webhook.IPs {
		ip := net.ParseIP(s)
		if ip == nil {
			return nil, fmt.Errorf("--webhook-ip-address %q is not an IP address", s)
		}
		ips = append(ips, ip)
	}
	certs := &ebbwebhook.SelfSignedCerts{
		Client: c, Secret: secret, DNSNames: o.Webhook.DNSNames, IPs: ips,
		CertDir: o.Webhook.CertDir, Mutating: o.Webhook.Mutating, Validating: o.Webhook.Validating,
	}
	if err := certs.Ensure(ctx); err != nil {
		return nil, fmt.Errorf("providing the webhook certificate: %w", err)
	}
	return certs, nil
}

// keepL2Key keeps the L2 heartbeat key Secret there (l2key).
func (o *Options) keepL2Key(c client.Client, mgr manager.Manager) error {
	if o.L2KeySecret == "" {
		return nil
	}
	secret, err := objectKeyFlag("l2-key-secret", o.L2KeySecret)
	if err != nil {
		return err
	}
	return mgr.Add(l2key.Keeper{Client: c, Secret: secret, Period: l2KeyCheck})
}

// objectKeyFlag parses the namespace/name value of a flag.
func objectKeyFlag(flag, value string) (client.ObjectKey, error) {
	ns, name, ok := strings.Cut(value, "/")
	if !ok || ns == "" || name == "" {
		return client.ObjectKey{}, fmt.Errorf("--%s %q: want namespace/name", flag, value)
	}
	return client.ObjectKey{Namespace: ns, Name: name}, nil
}

// l2KeyCheck is how often the controller checks that the L2 heartbeat key
// Secret is there.
const l2KeyCheck = 5 * time.Minute

// cloudDefaults applies what --cloud changes in other flags' defaults:
// on Azure, a spot preemption is marked as seed 000 says,
// cloudprovider.azure.microsoft.com/draining=spot-eviction, unless
// --spot-taint-key was given.
func (o *Options) cloudDefaults(changed func(flag string) bool) {
	if o.Cloud == "azure" && !changed("spot-taint-key") {
		o.SpotTaintKey = lbmodel.TaintAzureDraining
	}
}

// spotTaintCounts refuses a spot taint that the leaving signals do not
// count: the spot controller would mark preempted nodes with it, and no
// load balancer would take them out of rotation (ebb lb and the
// node-agent read the same list, so the controller cannot count it for
// them).
func spotTaintCounts(key string, model lbmodel.Options) error {
	if key == "" {
		return nil
	}
	node := &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: key, Value: lbmodel.SpotEvictionValue, Effect: corev1.TaintEffectNoSchedule}}}}
	if leaving, _ := lbmodel.IsLeaving(node, model); !leaving {
		return fmt.Errorf("--spot-taint-key %s: the leaving signals do not count %s=%s, so a preempted node would stay in rotation; add the line \"taint:%s=%s\" to the ConfigMap ebb-leaving-signals (docs/nodes-that-leave.md), or use another key", key, key, lbmodel.SpotEvictionValue, key, lbmodel.SpotEvictionValue)
	}
	return nil
}

// setupCloud runs the provider-backed admin state (--cloud).
func (o *Options) setupCloud(ctx context.Context, mgr ctrl.Manager) error {
	switch o.Cloud {
	case "":
		return nil
	case "azure":
	default:
		return fmt.Errorf("--cloud %q is not supported: use azure", o.Cloud)
	}
	cfg, from, err := o.loadAzureConfig(ctx, mgr.GetAPIReader())
	if err != nil {
		return err
	}
	if o.AzureMigrateOnStart && strings.EqualFold(cfg.LoadBalancerSKU, "standard") {
		kube, err := kubernetes.NewForConfig(mgr.GetConfig())
		if err != nil {
			return err
		}
		// Once, by the leader, when the manager starts.
		err = mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
			var out strings.Builder
			if err := azurecmd.Migrate(ctx, &out, cfg, kube, false); err != nil {
				ctrl.Log.WithName("azure-migrate").Error(err, "The Basic-to-Standard migration failed; it resumes at the next start", "output", out.String())
				return nil
			}
			ctrl.Log.WithName("azure-migrate").Info("Basic-to-Standard migration", "output", out.String())
			return nil
		}))
		if err != nil {
			return err
		}
	}
	if !cfg.EnableLoadBalancerAdminState {
		logr.FromContextOrDiscard(ctx).Info("Azure admin state is off (enableLoadBalancerAdminState is false in the configuration)")
		return nil
	}
	if err := cfg.ValidateForAdminState(); err != nil {
		return fmt.Errorf("the Azure configuration (%s): %w", from, err)
	}
	cred, err := cfg.Credential()
	if err != nil {
		return fmt.Errorf("the Azure credential: %w", err)
	}
	opts, err := cfg.ClientOptions()
	if err != nil {
		return err
	}
	m, err := azure.NewMetrics(metrics.Registry)
	if err != nil {
		return err
	}
	manager, err := azure.NewManager(cfg, cred, opts, m)
	if err != nil {
		return err
	}
	r := &azureadminstate.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ebb-azure-adminstate"), Manager: manager, Model: o.Model}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the Azure admin state: %w", err)
	}
	return nil
}

// setupLoadBalancing registers the Service load-balancer, spot, admin-state
// event and cloud admin-state controllers.
func (o *Options) setupLoadBalancing(ctx context.Context, mgr ctrl.Manager, ipam *service.Allocator) error {
	m, err := service.NewMetrics(metrics.Registry, ipam)
	if err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	r := &service.Reconciler{
		Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ebb-service-controller"),
		Class: o.LoadBalancerClass, DefaultLoadBalancer: o.DefaultLoadBalancer, IPAM: ipam, Metrics: m,
		PublishAtOnce: o.PublishAddressesAtOnce,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the service controller: %w", err)
	}
	pr := &service.PoolReconciler{Client: mgr.GetClient(), IPAM: ipam}
	if err := pr.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the address pool controller: %w", err)
	}
	if err := (&announcestatus.BGPPeerReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the BGP peer status controller: %w", err)
	}
	if err := (&announcestatus.PolicyReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the announcement policy status controller: %w", err)
	}
	if err := spotTaintCounts(o.SpotTaintKey, o.Model); err != nil {
		return err
	}
	if o.SpotTaintKey != "" {
		if !strings.HasPrefix(o.SpotTaintKey, "ebb.dev/") && o.SpotTaintKey != lbmodel.TaintAzureDraining {
			// config/policy's ebb-controller-node-writes lets ebb write
			// only these taints; a spot signal refused there would show
			// only as a failed reconcile.
			logr.FromContextOrDiscard(ctx).Info("Warning: --spot-taint-key is neither ebb.dev/* nor Azure's draining taint: add it to the ValidatingAdmissionPolicy ebb-controller-node-writes, which otherwise refuses it (docs/security.md)", "key", o.SpotTaintKey)
		}
		spotMetrics, err := spot.NewMetrics(metrics.Registry)
		if err != nil {
			return err
		}
		sr := &spot.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ebb-spot-controller"), Metrics: spotMetrics,
			TaintKey: o.SpotTaintKey, TrustedSources: o.SpotEventSources, Model: o.Model, LBNamespace: o.LBNamespace}
		if err := sr.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up the spot preemption controller: %w", err)
		}
	}
	ar := &adminstate.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ebb-adminstate-controller"), Model: o.Model}
	if err := ar.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the admin state events: %w", err)
	}
	holdMetrics, err := deletionhold.NewMetrics(metrics.Registry)
	if err != nil {
		return err
	}
	// Registered when off too: it then removes holds an earlier
	// configuration left, so that cluster-autoscaler never waits on ebb.
	hr := &deletionhold.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ebb-deletion-hold"), Metrics: holdMetrics,
		Model: o.Model, Enabled: o.DeletionHold, Timeout: o.DeletionHoldTimeout, LBNamespace: o.LBNamespace}
	if err := hr.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the deletion hold: %w", err)
	}
	if err := o.setupCloud(ctx, mgr); err != nil {
		return err
	}
	return nil
}

// setupMaintenance registers the NodeMaintenance, Evacuation and surge
// controllers and the admission webhooks.
func (o *Options) setupMaintenance(ctx context.Context, mgr ctrl.Manager) error {
	nmMetrics, err := nodemaintenance.NewMetrics(metrics.Registry)
	if err != nil {
		return err
	}
	nmr := &nodemaintenance.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ebb-nodemaintenance-controller"), Metrics: nmMetrics, MaxDrainingNodes: o.MaxDrainingNodes, LBNamespace: o.LBNamespace}
	if err := nmr.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the node maintenance controller: %w", err)
	}
	evMetrics, err := evacuation.NewMetrics(metrics.Registry)
	if err != nil {
		return err
	}
	er := &evacuation.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ebb-evacuation-controller"), Metrics: evMetrics, MaxEvictionsInFlight: o.MaxEvictionsInFlight}
	if err := er.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the evacuation controller: %w", err)
	}
	if o.SurgeEvacuator {
		sv := &surge.Evacuator{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ebb-surge-evacuator")}
		if err := sv.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up the surge evacuator: %w", err)
		}
	}
	if o.Webhook.Port != 0 {
		if err := (&ebbwebhook.NodeMaintenance{Client: mgr.GetClient(), LBNamespace: o.LBNamespace, Model: o.Model}).SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up the NodeMaintenance webhook: %w", err)
		}
		if err := (&ebbwebhook.Evacuation{Client: mgr.GetClient(), Pods: mgr.GetAPIReader()}).SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up the Evacuation webhook: %w", err)
		}
		if o.EvictionGuard {
			guard := &ebbwebhook.EvictionGuard{Reader: mgr.GetAPIReader(), Exempt: o.EvictionGuardExempt}
			mgr.GetWebhookServer().Register(ebbwebhook.EvictionGuardPath, &webhook.Admission{Handler: guard})
		}
	}
	return nil
}

// onlyHTTP1 turns HTTP/2 off on the webhook server, as the kubebuilder
// scaffold does: HTTP/2's stream multiplexing let one client cost a server
// far more than it sends (CVE-2023-44487, rapid reset; CVE-2023-39325), and
// the API server calls admission webhooks over HTTP/1.1 as well.
func onlyHTTP1(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }
