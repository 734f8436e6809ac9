// Package localcluster runs a real Kubernetes control plane (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler) with kwok-simulated
// nodes inside a private user, network and PID namespace, and gives every
// Running pod a real server on its IP and each simulated node what kube-proxy
// would serve. End-to-end tests, benchmarks, the demo and `ebb cluster` use it.
//
// A process first enters its own namespace with Reexec (tests: TestMain),
// then calls Start. Everything the cluster listens on is inside that
// namespace, so several clusters can run at once.
package localcluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/ebbdev/ebb/internal/localcluster/kubeproxy"
	"github.com/ebbdev/ebb/internal/localcluster/network"
	"github.com/ebbdev/ebb/internal/localcluster/realnode"
)

// EnvKeepDir, when set, keeps a stopped cluster's directory (logs,
// configuration) for a look after a failed test.
const EnvKeepDir = "EBB_KEEP_CLUSTER_DIR"

// KwokNodeAnnotation marks the nodes that kwok simulates.
const KwokNodeAnnotation = "kwok.x-k8s.io/node"

// Ports of the control-plane components. They are fixed: each cluster has a
// network namespace of its own.
const (
	// APIServerPort is the apiserver's secure port, on ControlPlaneIP.
	APIServerPort         = 6443
	controllerManagerPort = 10257
	schedulerPort         = 10259
	kwokPort              = 10247
)

// nodeMonitorGracePeriod is how long the node lifecycle controller waits
// for a node's heartbeat before it marks the node NotReady.
const nodeMonitorGracePeriod = 2 * time.Minute

// nodeLeaseSeconds is the duration of the node Leases kwok keeps; it
// renews them every quarter of it.
const nodeLeaseSeconds = 40

// Options configure a cluster.
type Options struct {
	// Name names the cluster in messages. Default "ebb".
	Name string
	// Nodes is the number of simulated nodes. Default 3.
	Nodes int
	// Dir holds etcd's data, certificates, logs and the kubeconfig. Default:
	// a new temporary directory, removed by Stop.
	Dir string
	// BinDir holds the pinned binaries. Default: FindBinDir.
	BinDir string
	// HostUserNamespace runs the cluster in the host's user namespace
	// (RunTests re-executes with ReexecInHostUserNamespace; the caller must
	// be root) instead of a new one, so that ebb lb's eBPF kernel path can
	// load its program: BPF needs capabilities in the initial user
	// namespace. Network, PID and mount namespaces stay private. Default:
	// a new user namespace, which needs no root.
	HostUserNamespace bool
	// Progress gets one line per start-up phase. Default: discarded.
	Progress io.Writer
	// Images are OCI image layouts (`make image` writes dist/oci): pods
	// whose images are there run as real processes (podrunner); every
	// other pod is simulated by an echo server. On real nodes
	// (RealKubelets) they are imported into every node's containerd.
	Images []string
	// RealKubelets makes every node a real one: containerd and the
	// upstream kubelet in the node's network namespace, with a mount
	// namespace and cgroup of its own (internal/localcluster/realnode),
	// the pause and agnhost images built and imported, and no kwok,
	// podrunner or pod servers for them. It needs root and the cluster in
	// the host's user namespace (HostUserNamespace is implied).
	RealKubelets bool
	// NodePorts is the apiserver's --service-node-port-range. Default
	// DefaultNodePorts, wide enough for the 3,000 node ports bench-service
	// makes; Kubernetes' own e2e tests need Kubernetes' default,
	// 30000-32767, which they hard-code (test/e2e/framework/service/jig.go).
	NodePorts utilnet.PortRange
	// CoreDNS, with RealKubelets, is a static coredns binary (`make
	// conformance` builds one): the cluster runs it as its DNS, kube-dns in
	// kube-system at ClusterDNSIP, and pods resolve Services by name.
	// Default: no cluster DNS.
	CoreDNS string
	// KubeProxyMinSyncPeriod is every kube-proxy's minSyncPeriod, the
	// least time between two rule syncs: how long a new Service's node
	// port or an endpoint change may wait to be programmed. Default
	// upstream's, 1 s (kubeproxy.DefaultMinSyncPeriod), as users' clusters
	// run.
	KubeProxyMinSyncPeriod time.Duration
}

// Node is a simulated node.
type Node struct {
	Name string
	// IP and IPv6 are its InternalIPs (bare nodes have no IPv6).
	IP, IPv6 string
	// PodCIDR and PodCIDRv6 are its pod ranges (bare nodes: IPv4 only).
	PodCIDR, PodCIDRv6 string
	// Host is the node's machine: its network namespace.
	Host *network.Host
}

// Cluster is a running local cluster.
type Cluster struct {
	// Config is an administrator's client configuration (system:masters).
	Config *rest.Config
	// Client is a clientset for Config.
	Client kubernetes.Interface
	// Kubeconfig is the path of an administrator's kubeconfig.
	Kubeconfig string
	// BinDir holds the binaries the cluster runs (kubectl among them).
	BinDir string
	// Nodes are the simulated nodes, in order.
	Nodes []Node
	// Network is the cluster's network: a namespace per node, the bridge
	// between them, the router and the client (see topology.go).
	Network *network.Network
	// Router sits between the node network and the client subnet.
	Router *network.Host
	// ExternalClient is a host on the client subnet behind the router:
	// traffic from it reaches the cluster the way a user's does.
	ExternalClient *network.Host
	// WebhookClientCAFile is the CA of the client certificate the
	// apiserver presents to webhooks in ebb-system (for ebb controller's
	// --webhook-client-ca-file); WebhookClientCertFile and
	// WebhookClientKeyFile are that certificate and its key.
	WebhookClientCAFile, WebhookClientCertFile, WebhookClientKeyFile string

	opts     Options
	ownsDir  bool
	env      *envtest.Environment
	procs    []*process
	cancel   context.CancelFunc
	simsDone chan struct{}
	taps     map[string]*network.SYNTap
	// realNodes run kubelet and containerd (Options.RealKubelets).
	realNodes    []*realNode
	kubeletCerts clientCerts
}

// Start starts a cluster and returns once its nodes are Ready and its
// controllers serve. It must run inside a namespace made by Reexec.
func Start(ctx context.Context, opts Options) (_ *Cluster, retErr error) {
	if !InNamespace() {
		return nil, errors.New("the local cluster runs only in a private network namespace: call localcluster.Reexec first (tests: localcluster.TestMain)")
	}
	opts = withDefaults(opts)
	c := &Cluster{opts: opts}
	defer func() {
		if retErr != nil {
			_ = c.Stop()
		}
	}()
	if opts.Dir == "" {
		dir, err := os.MkdirTemp("", "ebb-cluster-")
		if err != nil {
			return nil, fmt.Errorf("creating the cluster directory: %w", err)
		}
		c.opts.Dir, c.ownsDir = dir, true
	}
	if opts.BinDir == "" {
		dir, err := FindBinDir()
		if err != nil {
			return nil, err
		}
		c.opts.BinDir = dir
	} else if err := CheckBinDir(opts.BinDir); err != nil {
		return nil, err
	}
	c.BinDir = c.opts.BinDir
	if opts.CoreDNS != "" && !opts.RealKubelets {
		return nil, errors.New("the cluster DNS (Options.CoreDNS) runs on real nodes only: set Options.RealKubelets")
	}
	if opts.RealKubelets {
		if os.Getenv(envHostUserNamespace) == "" {
			return nil, errors.New("real nodes (Options.RealKubelets) run in the host's user namespace: start the process with localcluster.ReexecInHostUserNamespace (RunTests does), as root")
		}
		if err := realnode.CheckHost(realnode.DefaultCNIBinDir); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{"logs", "pki", "etcd"} {
		if err := os.MkdirAll(filepath.Join(c.opts.Dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("creating the cluster directory: %w", err)
		}
	}
	start := time.Now()
	if err := c.buildNetwork(); err != nil {
		return nil, err
	}
	if err := c.startControlPlane(); err != nil {
		return nil, err
	}
	if err := c.startComponents(); err != nil {
		return nil, err
	}
	if opts.RealKubelets {
		if err := c.startRealNodes(ctx); err != nil {
			return nil, err
		}
	} else if err := c.registerNodes(ctx); err != nil {
		return nil, err
	}
	if err := c.startKubeProxies(); err != nil {
		return nil, err
	}
	if opts.RealKubelets {
		if err := c.startNodeTaps(); err != nil {
			return nil, err
		}
	} else if err := c.startSimulators(); err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx); err != nil {
		return nil, err
	}
	if opts.CoreDNS != "" {
		if err := c.startDNS(ctx); err != nil {
			return nil, err
		}
	}
	c.progressf("cluster %q ready in %s: %d nodes, kubeconfig %s", c.opts.Name, time.Since(start).Round(100*time.Millisecond), len(c.Nodes), c.Kubeconfig)
	return c, nil
}

func withDefaults(o Options) Options {
	if o.Name == "" {
		o.Name = "ebb"
	}
	if o.Nodes <= 0 {
		o.Nodes = 3
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.NodePorts.Size == 0 {
		o.NodePorts = DefaultNodePorts
	}
	return o
}

func (c *Cluster) progressf(format string, args ...any) {
	fmt.Fprintf(c.opts.Progress, "[cluster] "+format+"\n", args...)
}

func (c *Cluster) logFile(name string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(c.opts.Dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log for %s: %w", name, err)
	}
	return f, nil
}

// startControlPlane starts etcd and kube-apiserver through envtest, which
// makes the certificates and waits for readiness, and writes kubeconfigs.
func (c *Cluster) startControlPlane() error {
	c.progressf("starting etcd and kube-apiserver")
	etcdLog, err := c.logFile("etcd")
	if err != nil {
		return err
	}
	apiLog, err := c.logFile("kube-apiserver")
	if err != nil {
		return err
	}
	api := &envtest.APIServer{CertDir: filepath.Join(c.opts.Dir, "pki"), Out: apiLog, Err: apiLog, StartTimeout: 90 * time.Second}
	// Serve on the control-plane host's address on the node network, so
	// that the nodes' kube-proxies (and later pods) reach the apiserver;
	// envtest puts the address in the serving certificate.
	// The port is fixed: the cluster has a network of its own.
	api.SecureServing.ListenAddr = envtest.ListenAddr{Address: controlPlaneIP, Port: fmt.Sprint(APIServerPort)}
	api.Configure().
		Set("service-cluster-ip-range", ServiceCIDR.String()+","+ServiceCIDRv6.String()).
		// The namespace has no default route, so say which address to
		// publish for the kubernetes Service.
		Set("advertise-address", controlPlaneIP).
		Set("authorization-mode", "Node,RBAC").
		Set("service-node-port-range", c.opts.NodePorts.String()).
		// envtest turns the ServiceAccount admission plugin off because it
		// runs no controller manager; this cluster does, so admission stays
		// as a real cluster has it.
		Disable("disable-admission-plugins").
		// Webhooks and aggregated APIs are called at their endpoints'
		// addresses, not their ClusterIPs: the control-plane host runs no
		// kube-proxy (as on many managed control planes).
		Set("enable-aggregator-routing", "true")
	if err := writeServingCert(api); err != nil {
		return err
	}
	// The apiserver presents a client certificate to ebb's webhooks,
	// which they require with config/components/webhook-client-auth.
	admission, webhookCerts, err := writeWebhookClientConfig(api.CertDir)
	if err != nil {
		return err
	}
	c.WebhookClientCAFile, c.WebhookClientCertFile, c.WebhookClientKeyFile = webhookCerts.CAFile, webhookCerts.CertFile, webhookCerts.KeyFile
	api.Configure().Set("admission-control-config-file", admission)
	if c.opts.RealKubelets {
		// exec, logs, port-forward and the proxy subresources go to
		// kubelets, at their InternalIPs (the node network; node names
		// do not resolve here), with a client certificate they trust.
		certs, err := writeKubeletClientCerts(api.CertDir)
		if err != nil {
			return err
		}
		c.kubeletCerts = certs
		api.Configure().
			Set("kubelet-client-certificate", certs.CertFile).
			Set("kubelet-client-key", certs.KeyFile).
			Set("kubelet-preferred-address-types", "InternalIP").
			// As kubeadm's: a kubelet may change only its own Node and
			// its pods.
			Set("enable-admission-plugins", "NodeRestriction")
	}
	c.env = &envtest.Environment{
		BinaryAssetsDirectory: c.opts.BinDir,
		ControlPlane: envtest.ControlPlane{
			Etcd:      &envtest.Etcd{DataDir: filepath.Join(c.opts.Dir, "etcd"), Out: etcdLog, Err: etcdLog, StartTimeout: 60 * time.Second},
			APIServer: api,
		},
	}
	if _, err := c.env.Start(); err != nil {
		return fmt.Errorf("starting etcd and kube-apiserver (logs in %s): %w", filepath.Join(c.opts.Dir, "logs"), err)
	}
	admin, user, err := c.writeKubeconfig("admin", envtest.User{Name: "ebb-admin", Groups: []string{"system:masters"}})
	if err != nil {
		return err
	}
	c.Kubeconfig = admin
	c.Config = user.Config()
	c.Config.QPS, c.Config.Burst = 200, 400
	c.Client, err = kubernetes.NewForConfig(c.Config)
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	return nil
}

// controlPlaneIP is the address published for the kubernetes Service.
const controlPlaneIP = "10.0.0.254"

// writeKubeconfig adds a user with a client certificate and writes its
// kubeconfig; it returns the file's path and the user.
func (c *Cluster) writeKubeconfig(name string, u envtest.User) (string, *envtest.AuthenticatedUser, error) {
	user, err := c.env.AddUser(u, nil)
	if err != nil {
		return "", nil, fmt.Errorf("adding user %s: %w", u.Name, err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		return "", nil, fmt.Errorf("rendering the kubeconfig of %s: %w", u.Name, err)
	}
	path := filepath.Join(c.opts.Dir, name+".kubeconfig")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", nil, fmt.Errorf("writing %s: %w", path, err)
	}
	return path, user, nil
}

// waitReady waits for Ready nodes, serving controllers and the default
// service account (which the controller manager makes).
func (c *Cluster) waitReady(ctx context.Context) error {
	c.progressf("waiting for nodes and controllers")
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	insecure := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // local health checks of self-signed components
	plain := &http.Client{Timeout: 2 * time.Second}
	healthy := func(port int) bool {
		resp, err := insecure.Get(fmt.Sprintf("https://%s/healthz", net.JoinHostPort("127.0.0.1", fmt.Sprint(port))))
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	var last string
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		for _, p := range c.procs {
			if done, err := p.exited(); done {
				return false, err
			}
		}
		if !healthy(controllerManagerPort) {
			last = "kube-controller-manager is not healthy"
			return false, nil
		}
		if !healthy(schedulerPort) {
			last = "kube-scheduler is not healthy"
			return false, nil
		}
		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		ready := 0
		for i := range nodes.Items {
			if NodeReady(&nodes.Items[i]) {
				ready++
			}
		}
		if ready < len(c.Nodes) {
			last = fmt.Sprintf("%d of %d nodes Ready", ready, len(c.Nodes))
			return false, nil
		}
		if _, err := c.Client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			last = "no default service account yet"
			return false, nil
		}
		// kube-proxy's /healthz turns 200 once it has programmed the
		// node's rules.
		for _, n := range c.Nodes {
			resp, err := plain.Get(fmt.Sprintf("http://%s/healthz", net.JoinHostPort(n.IP, fmt.Sprint(kubeproxy.HealthPort))))
			if err != nil {
				last = fmt.Sprintf("kube-proxy on %s does not answer: %v", n.Name, err)
				return false, nil
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				last = fmt.Sprintf("kube-proxy on %s is not healthy (%d)", n.Name, resp.StatusCode)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the cluster to be ready (%s; logs in %s): %w", last, filepath.Join(c.opts.Dir, "logs"), err)
	}
	return nil
}

// StartProcess starts a program inside the cluster's namespace, its output
// going to Dir/logs/name.log.
// The returned function stops it (SIGTERM, then SIGKILL after 10 s).
func (c *Cluster) StartProcess(name, path string, args ...string) (stop func() error, err error) {
	p, err := startProcess(name, path, args, filepath.Join(c.opts.Dir, "logs"))
	if err != nil {
		return nil, err
	}
	return func() error { return p.stop(10 * time.Second) }, nil
}

// RealKubelets says whether the nodes are real (Options.RealKubelets).
func (c *Cluster) RealKubelets() bool { return c.opts.RealKubelets }

// Dir is the cluster's working directory (logs are in Dir/logs).
func (c *Cluster) Dir() string { return c.opts.Dir }

// Node returns the node of the cluster's plan named name.
func (c *Cluster) Node(name string) (Node, bool) {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return Node{}, false
}

// Stop stops every component by PID, newest first, and removes the
// directory if Start made it.
func (c *Cluster) Stop() error {
	var errs []error
	if c.cancel != nil {
		c.cancel()
		<-c.simsDone
	}
	for _, rn := range c.realNodes {
		errs = append(errs, rn.stop())
	}
	if len(c.realNodes) > 0 {
		cgroups, err := realnode.FindCgroups()
		if err == nil {
			// /ebb itself stays: another cluster may be making its
			// cgroups under it right now.
			err = cgroups.Remove(c.clusterCgroup(), 30*time.Second)
		}
		errs = append(errs, err)
	}
	c.realNodes = nil
	for i := len(c.procs) - 1; i >= 0; i-- {
		errs = append(errs, c.procs[i].stop(10*time.Second))
	}
	c.procs = nil
	if c.env != nil {
		if err := c.env.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stopping etcd and kube-apiserver: %w", err))
		}
		c.env = nil
	}
	if c.Network != nil {
		c.Network.Close()
		c.Network = nil
	}
	if c.ownsDir {
		if os.Getenv(EnvKeepDir) != "" {
			c.progressf("kept the cluster's directory %s (%s is set)", c.opts.Dir, EnvKeepDir)
		} else {
			errs = append(errs, os.RemoveAll(c.opts.Dir))
		}
	}
	return errors.Join(errs...)
}

// StartProcessOn starts a program on one host of the cluster's network (a
// node's name, HostRouter or HostClient; HostControlPlane is StartProcess),
// its output going to Dir/logs/name.log. The returned function stops it
// (SIGTERM, then SIGKILL after 10 s).
func (c *Cluster) StartProcessOn(host, name, path string, args ...string) (stop func() error, err error) {
	h, ok := c.Network.Host(host)
	if !ok {
		return nil, fmt.Errorf("the cluster has no host %q", host)
	}
	p, err := startProcessOn(h, name, path, args, filepath.Join(c.opts.Dir, "logs"))
	if err != nil {
		return nil, err
	}
	return func() error { return p.stop(10 * time.Second) }, nil
}
