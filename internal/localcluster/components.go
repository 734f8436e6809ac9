package localcluster

// The cluster's components besides etcd and the apiserver: the
// controllers, kwok and its simulated nodes, a kube-proxy per node, and
// what serves the simulated nodes' pods.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/ebbdev/ebb/internal/localcluster/kubeproxy"
	"github.com/ebbdev/ebb/internal/localcluster/podrunner"
	"github.com/ebbdev/ebb/internal/localcluster/podserver"
)

// startComponents starts kube-controller-manager, kube-scheduler and kwok,
// each with the identity the bootstrap RBAC policy expects.
func (c *Cluster) startComponents() error {
	c.progressf("starting kube-controller-manager, kube-scheduler and kwok")
	kcmConfig, _, err := c.writeKubeconfig("kube-controller-manager", envtest.User{Name: "system:kube-controller-manager"})
	if err != nil {
		return err
	}
	schedConfig, _, err := c.writeKubeconfig("kube-scheduler", envtest.User{Name: "system:kube-scheduler"})
	if err != nil {
		return err
	}
	caFile := filepath.Join(c.opts.Dir, "pki", "cluster-ca.crt")
	if err := os.WriteFile(caFile, c.Config.CAData, 0o644); err != nil {
		return fmt.Errorf("writing the cluster CA: %w", err)
	}
	pki := c.env.ControlPlane.APIServer.CertDir
	stages, err := kwokStages(c.opts.BinDir, c.opts.Dir)
	if err != nil {
		return err
	}
	kwokArgs := []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=" + KwokNodeAnnotation + "=fake",
		"--cidr=" + PodCIDR.String(),
		"--node-ip=" + controlPlaneIP,
		fmt.Sprintf("--server-address=127.0.0.1:%d", kwokPort),
		// Node Leases, renewed every 10 s, as kubelets do. Without this
		// flag kwok v0.8.0 keeps none (its configuration's default of 40
		// applies only to a KwokConfiguration file), and the heartbeat
		// stage writes node status only every 10 to 20 minutes: the node
		// lifecycle controller then marked every node NotReady each
		// --node-monitor-grace-period ("all Nodes are not-Ready. Entering
		// master disruption mode"), their pods unready, until kwok's
		// initialize stage made the nodes Ready again a moment later.
		// Traffic to a single replica failed whenever that flap fell in a
		// test's window (CI: TestSurgeMovesASingleReplicaWithoutDowntime).
		fmt.Sprintf("--node-lease-duration-seconds=%d", nodeLeaseSeconds),
	}
	for _, s := range stages {
		kwokArgs = append(kwokArgs, "--config="+s)
	}
	components := []struct {
		name string
		args []string
	}{
		{"kube-controller-manager", []string{
			"--kubeconfig=" + kcmConfig,
			"--authentication-kubeconfig=" + kcmConfig,
			"--authorization-kubeconfig=" + kcmConfig,
			"--service-account-private-key-file=" + filepath.Join(pki, "sa-signer.key"),
			"--root-ca-file=" + caFile,
			"--use-service-account-credentials=true",
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", controllerManagerPort),
			// Every controller that makes sense without a cloud; node IPAM is
			// off because the nodes come with their pod CIDRs.
			"--controllers=*,-nodeipam",
			// The default 20 requests per second starve the deployment and
			// replica set controllers while namespaces of finished tests
			// are being deleted.
			"--kube-api-qps=200",
			"--kube-api-burst=400",
			"--cluster-name=" + c.opts.Name,
			// kwok's simulated heartbeats can lapse on a busy 2-core
			// machine; a longer grace keeps nodes from flapping NotReady
			// (watchHeartbeats reports each lapse).
			"--node-monitor-grace-period=" + nodeMonitorGracePeriod.String(),
		}},
		{"kube-scheduler", []string{
			"--kubeconfig=" + schedConfig,
			"--authentication-kubeconfig=" + schedConfig,
			"--authorization-kubeconfig=" + schedConfig,
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", schedulerPort),
			"--kube-api-qps=200",
			"--kube-api-burst=400",
		}},
		{"kwok", kwokArgs},
	}
	for _, comp := range components {
		p, err := startProcess(comp.name, filepath.Join(c.opts.BinDir, comp.name), comp.args, filepath.Join(c.opts.Dir, "logs"))
		if err != nil {
			return err
		}
		c.procs = append(c.procs, p)
	}
	return nil
}

// registerNodes creates the simulated nodes with their InternalIPs and pod
// CIDRs; kwok makes them Ready and keeps their heartbeats.
func (c *Cluster) registerNodes(ctx context.Context) error {
	c.progressf("registering %d simulated nodes", len(c.Nodes))
	for _, n := range c.Nodes {
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, nodeObject(n), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("registering node %s: %w", n.Name, err)
		}
	}
	return nil
}

// startKubeProxies starts the upstream kube-proxy on every node, in the
// node's network namespace, as the identity the bootstrap RBAC policy
// grants kube-proxy's permissions to (system:kube-proxy).
func (c *Cluster) startKubeProxies() error {
	c.progressf("starting kube-proxy on %d nodes", len(c.Nodes))
	kubeconfig, _, err := c.writeKubeconfig("kube-proxy", envtest.User{Name: "system:kube-proxy"})
	if err != nil {
		return err
	}
	for _, n := range c.Nodes {
		args, err := kubeproxy.WriteConfig(c.opts.Dir, kubeproxy.Node{Name: n.Name, ClusterCIDRs: []string{PodCIDR.String(), PodCIDRv6.String()}, MinSyncPeriod: c.opts.KubeProxyMinSyncPeriod}, kubeconfig)
		if err != nil {
			return err
		}
		p, err := startProcessOn(n.Host, "kube-proxy-"+n.Name, filepath.Join(c.opts.BinDir, "kube-proxy"), args, filepath.Join(c.opts.Dir, "logs"))
		if err != nil {
			return err
		}
		c.procs = append(c.procs, p)
	}
	return nil
}

func nodeObject(n Node) *corev1.Node {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	podCIDRs := []string{n.PodCIDR}
	addrs := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IP}}
	if n.IPv6 != "" {
		podCIDRs = append(podCIDRs, n.PodCIDRv6)
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: n.IPv6})
	}
	addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeHostName, Address: n.Name})
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        n.Name,
			Annotations: map[string]string{KwokNodeAnnotation: "fake"},
			Labels: map[string]string{
				corev1.LabelHostname:   n.Name,
				corev1.LabelOSStable:   "linux",
				corev1.LabelArchStable: "amd64",
				"type":                 "kwok",
			},
		},
		Spec: corev1.NodeSpec{PodCIDR: n.PodCIDR, PodCIDRs: podCIDRs},
		Status: corev1.NodeStatus{
			Addresses:   addrs,
			Capacity:    capacity,
			Allocatable: capacity,
		},
	}
}

// startSimulators runs the pod servers, each pod's on its node's host, the
// runner of the pods whose images the cluster has, and the taps that see
// new connections reach the nodes.
func (c *Cluster) startSimulators() error {
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.simsDone = make(chan struct{})
	if err := c.startTaps(ctx); err != nil {
		close(c.simsDone)
		return err
	}
	pods := podserver.New(c.Client, func(node string) (podserver.Sockets, error) {
		h, ok := c.Network.Host(node)
		if !ok {
			return nil, fmt.Errorf("node %s has no host in the local cluster", node)
		}
		return h, nil
	})
	var runner *podrunner.Runner
	if len(c.opts.Images) > 0 {
		logDir := filepath.Join(c.opts.Dir, "logs", "pods")
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			close(c.simsDone)
			return fmt.Errorf("creating the pods' log directory: %w", err)
		}
		runner = podrunner.New(podrunner.Options{
			Client:        c.Client,
			Images:        podrunner.NewImages(filepath.Join(c.opts.Dir, "images"), c.opts.Images...),
			Machines:      c.Network,
			Dir:           filepath.Join(c.opts.Dir, "pods"),
			LogDir:        logDir,
			APIServerHost: kubernetesServiceIP,
			APIServerPort: 443,
		})
		pods.Skip(runner.Runs)
	}
	heartbeatsDone := make(chan struct{})
	go func() {
		defer close(heartbeatsDone)
		watchHeartbeats(ctx, c.Client, clock.RealClock{}, c.opts.Progress, filepath.Join(c.opts.Dir, "logs", "kwok.log"))
	}()
	go func() {
		defer close(c.simsDone)
		defer func() { <-heartbeatsDone }()
		done := make(chan struct{})
		if runner != nil {
			go func() {
				defer close(done)
				_ = runner.Run(ctx)
			}()
		} else {
			close(done)
		}
		_ = pods.Run(ctx)
		<-done
	}()
	return nil
}

// startNodeTaps runs the taps that see new connections reach the nodes
// (LastNewConnection), alone: real nodes need no simulators.
func (c *Cluster) startNodeTaps() error {
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.simsDone = make(chan struct{})
	close(c.simsDone)
	return c.startTaps(ctx)
}
