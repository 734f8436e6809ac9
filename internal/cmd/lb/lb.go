// Package lb implements `ebb lb`: the data plane. Today it runs standalone
// from a YAML configuration file; the Kubernetes-driven mode (Services of
// class ebb.dev/l4) comes with the Service load balancer.
package lb

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/announce/bgp"
	"github.com/ebbdev/ebb/internal/announce/l2"
	"github.com/ebbdev/ebb/internal/cmd/kubeconfig"
	"github.com/ebbdev/ebb/internal/cmd/leavingflag"
	"github.com/ebbdev/ebb/internal/cmd/podns"
	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/lbsync"
)

// Options are `ebb lb`'s flags.
type Options struct {
	// ConfigFile is the YAML configuration (see docs/dataplane.md).
	ConfigFile string
	// MetricsAddress serves /metrics; empty turns it off.
	MetricsAddress string
	// SecureMetricsAddress serves /metrics over HTTPS to callers the API
	// server authorizes; empty turns it off.
	SecureMetricsAddress string
	// PollInterval is how often the file is checked for changes. Polled,
	// not watched with inotify: a ConfigMap volume replaces the file by
	// swapping a symlinked directory, which file watchers must special-
	// case and polling compares by content for free.
	PollInterval time.Duration
	// PprofAddress serves net/http/pprof, for profiling; empty turns it off.
	PprofAddress string

	// Without ConfigFile, the Services of the cluster are served.
	Kubeconfig          string
	LoadBalancerClass   string
	DefaultLoadBalancer bool
	Model               lbmodel.Options
	// ReportName names this replica's LoadBalancerReport; empty: none.
	ReportName      string
	ReportHeartbeat time.Duration
	// LocalRoutes adds a local route per served address (vipaddr), so the
	// host accepts the addresses' traffic without configuring them.
	LocalRoutes bool
	// GuardAddresses drops what reaches those addresses on a protocol and
	// port that no frontend serves (guard.go).
	GuardAddresses bool
	// BGP announces the served addresses to BGP peers when BGP.ASN is set.
	BGP      bgp.Config
	BGPPeers []string
	// BGPHoldTime applies to every --bgp-peer.
	BGPHoldTime time.Duration
	// BGPPeersFromAPI peers with the routers of the BGPPeer objects that
	// choose this host (cluster mode), reading their passwords from
	// Secrets in BGPSecretNamespace.
	BGPPeersFromAPI    bool
	BGPSecretNamespace string
	// VIPPools are the controller's deprecated --vip-pool CIDRs: addresses
	// served besides the AddressPools' (lbsync.SkipOutsidePools).
	VIPPools []string
	// L2 announces the served addresses by ARP and NDP on L2.Interfaces,
	// one replica owning each address, when any is given (Group and Node
	// are filled in from the class and the node name).
	L2 l2.Config
	// L2KeySecret (namespace/name) holds the keys that sign the L2
	// heartbeats; L2KeyDir, a directory laid out like a mounted Secret,
	// replaces it (and is the only source without a cluster).
	L2KeySecret, L2KeyDir string
	// ShutdownDelay and ShutdownTimeout pace a graceful stop (see
	// shutdown.go).
	ShutdownDelay, ShutdownTimeout time.Duration
	// Engine serves frontends that name none (dataplane.Options.Engine);
	// KernelTable names the kernel engine's nftables tables.
	Engine      string
	KernelTable string
	// KernelPath, BPFPinDir and BPFInterfaces: how the kernel engine
	// forwards (dataplane.Options).
	KernelPath    string
	BPFPinDir     string
	BPFInterfaces []string
	// ProxyGoroutines: dataplane.Options.GoroutineProxy.
	ProxyGoroutines bool
	// UDPFlows bounds the proxy engine's UDP flows
	// (dataplane.Options.UDPFlows).
	UDPFlows dataplane.UDPLimits
	// NodeName is the node this replica runs on: when it gets a leaving
	// taint, the replica drains itself.
	NodeName string
	// ForwardMovedFlows sends the segments of flows the routers move here
	// from a draining LB host back to it (flows.go); WithdrawDelay is how
	// long a leaving host waits for the others to do so before it
	// withdraws its announcements.
	ForwardMovedFlows bool
	WithdrawDelay     time.Duration
	// JoinForward is how long a host that starts announcing forwards the
	// flows the routers move to it back to the other hosts.
	JoinForward time.Duration
	// HandoffSocket is where this process takes the sockets of the ebb lb
	// running on the host, and offers its own to the next (handoff.go);
	// empty turns hand-off off.
	HandoffSocket string
	// LegacyHandoffSocket is where a predecessor of an earlier version
	// offers (DefaultLegacyHandoffSocket): asked only when nobody offers
	// at HandoffSocket; empty: never.
	LegacyHandoffSocket string
	// ExitAfterHandoff ends the process once it handed over and its
	// connections ended; otherwise it waits to be stopped (in a pod, an
	// exit would be restarted by the kubelet).
	ExitAfterHandoff bool

	// incomplete is set while the last load left a frontend unserved.
	incomplete bool
}

// DefaultHandoffSocket is --handoff-socket's default: a path in a
// directory that only ebb lb may enter (0700, made so at start; in a pod a
// hostPath volume that only ebb lb's pods mount, config/lb), one per
// network namespace (handoffSocketPath): the two processes of a host share
// it, two hosts (or two network namespaces on one machine) never do. An
// abstract socket, what earlier versions used, is open to every process of
// the network namespace: a hostNetwork pod running as root could take
// every listener.
const DefaultHandoffSocket = "auto"

// handoffRunDir holds the hand-off sockets of --handoff-socket=auto.
const handoffRunDir = "/run/ebb-lb"

// DefaultLegacyHandoffSocket is where versions before the path socket
// offered their sockets: a successor asks there when nobody offers at
// --handoff-socket, so that the upgrade from such a version hands over too.
const DefaultLegacyHandoffSocket = "@ebb-lb-handoff"

// NewCommand returns `ebb lb`.
func NewCommand() *cobra.Command {
	o := &Options{}
	zapOpts := zap.Options{}
	cmd := &cobra.Command{
		Use:   "lb [--config FILE]",
		Short: "Run the L4 load balancer (data plane), for the cluster's Services or from a file",
		Long: `Run ebb's L4 load balancer.

Without --config it serves the cluster's Services of type LoadBalancer whose
loadBalancerClass is ebb's (ebb.dev/l4): it watches them, their
EndpointSlices and the Nodes, and serves the addresses the controller wrote
to their status, with node backends' admin state from the nodes' taints.

With --config it runs standalone from a YAML file: TCP and UDP frontends,
backends with an admin state (None, Down, Up), health probes, balancing,
source ranges, PROXY protocol v2. The file is reloaded on SIGHUP and when it
changes; an invalid file is reported and the running configuration stays.
See docs/dataplane.md for the format.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := zap.New(zap.UseFlagOptions(&zapOpts))
			return o.Run(logr.NewContext(cmd.Context(), log))
		},
	}
	cmd.Flags().StringVar(&o.ConfigFile, "config", "", "YAML configuration file (standalone mode)")
	cmd.Flags().StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, then $KUBECONFIG)")
	cmd.Flags().StringVar(&o.LoadBalancerClass, "load-balancer-class", lbmodel.ClassL4, "spec.loadBalancerClass of the Services to serve")
	cmd.Flags().BoolVar(&o.DefaultLoadBalancer, "default-load-balancer", false, "also serve LoadBalancer Services that set no class")
	cmd.Flags().Uint16Var(&o.Model.NodeHealthPort, "node-health-port", lbmodel.DefaultNodeHealthPort, "port of the nodes' /healthz (kube-proxy's or ebb node-agent's)")
	cmd.Flags().BoolVar(&o.Model.IgnoreAutoscalerTaint, "ignore-autoscaler-taint", false, "do not treat ToBeDeletedByClusterAutoscaler as leaving")
	leavingflag.Add(cmd.Flags(), &o.Model.LeavingSignals)
	cmd.Flags().BoolVar(&o.Model.AdminStateDisabled, "disable-admin-state", false, "leave admin states None: only health probes decide")
	cmd.Flags().StringVar(&o.MetricsAddress, "metrics-bind-address", "127.0.0.1:9464", "address serving Prometheus /metrics (empty: off)")
	cmd.Flags().StringVar(&o.SecureMetricsAddress, "secure-metrics-bind-address", "", "address serving /metrics over HTTPS (a self-signed certificate) to callers whose token the API server authenticates and allows GET on /metrics, e.g. Prometheus through a ServiceMonitor (empty: off; not with --config)")
	cmd.Flags().StringVar(&o.PprofAddress, "pprof-bind-address", "", "address serving /debug/pprof for profiling (empty: off)")
	cmd.Flags().DurationVar(&o.PollInterval, "poll-interval", time.Second, "how often to check the configuration file for changes")
	cmd.Flags().StringVar(&o.ReportName, "report-name", defaultReportName(), "name of this replica's LoadBalancerReport (per-node admin state and connections, read by NodeMaintenance); empty: no report")
	cmd.Flags().BoolVar(&o.LocalRoutes, "local-routes", true, "add a local route (table local, proto 235) for every address served, so this host accepts its traffic without the address configured on an interface; needs CAP_NET_ADMIN (false: configure the addresses yourself)")
	cmd.Flags().BoolVar(&o.GuardAddresses, "guard-addresses", true, "drop every packet to an address the local routes cover whose protocol and port no frontend serves (nftables table inet ebb-guard; ICMP, later fragments and the host's own traffic pass), so this host's own services (sshd, the kubelet) are not reachable on the load balancer's addresses; needs CAP_NET_ADMIN")
	cmd.Flags().Uint32Var(&o.BGP.ASN, "bgp-asn", 0, "this host's AS number: announce every address served to the --bgp-peer routers (0: no BGP unless a BGPPeer object chooses this host, whose myASN is then used)")
	cmd.Flags().StringArrayVar(&o.BGPPeers, "bgp-peer", nil, "a BGP peer as ADDRESS:ASN, e.g. 10.0.0.253:64500 (repeatable)")
	cmd.Flags().TextVar(&o.BGP.RouterID, "bgp-router-id", routerIDFromEnv(), "BGP identifier and next hop of the announced routes: an IPv4 address of this host the peers reach (default: $NODE_IP)")
	cmd.Flags().TextVar(&o.BGP.NextHopIPv6, "bgp-next-hop-ipv6", ipv6FromEnv(), "next hop of the announced IPv6 routes (carried by MP-BGP on every session): an IPv6 address of this host the peers reach (default: the first IPv6 address in $NODE_IPS; none: IPv6 addresses are not announced)")
	cmd.Flags().DurationVar(&o.BGPHoldTime, "bgp-hold-time", 90*time.Second, "BGP hold time offered to the --bgp-peer routers (keepalives every third of it); a dead host's routes last this long at most")
	cmd.Flags().BoolVar(&o.BGPPeersFromAPI, "bgp-peers-from-api", true, "peer with the routers of the BGPPeer objects (lb.ebb.dev) whose nodeSelector matches this node, besides any --bgp-peer; cluster mode")
	cmd.Flags().StringSliceVar(&o.VIPPools, "vip-pool", nil, "deprecated, as the controller's: CIDRs whose addresses are served besides the AddressPools' (an address in a Service's status that lies in neither is not served; give the controller's --vip-pool values here too)")
	cmd.Flags().StringVar(&o.BGPSecretNamespace, "bgp-secret-namespace", podns.Namespace(), "namespace of the Secrets holding BGPPeers' passwords (default: $POD_NAMESPACE, else ebb-system)")
	cmd.Flags().StringArrayVar(&o.L2.Interfaces, "l2-interface", nil, "announce every address served on this interface's segment by ARP and NDP, one ebb lb replica owning each address (repeatable; needs CAP_NET_RAW and CAP_NET_ADMIN; see docs/l2.md)")
	cmd.Flags().StringVar(&o.L2KeySecret, "l2-key-secret", defaultL2KeySecret(), "Secret (namespace/name) of the keys that sign the L2 heartbeats, which the controller creates with one random key; without a key no L2 address is owned (docs/l2.md, \"Heartbeat keys\")")
	cmd.Flags().StringVar(&o.L2KeyDir, "l2-key-dir", "", "directory of the L2 heartbeat keys laid out like a mounted Secret (a file per key, signing-key naming the one to sign with), read every 10 s; replaces --l2-key-secret")
	cmd.Flags().DurationVar(&o.L2.Interval, "l2-heartbeat-interval", 100*time.Millisecond, "how often this replica tells the others on the --l2-interface segments that it is alive")
	cmd.Flags().DurationVar(&o.L2.DeadAfter, "l2-dead-after", 500*time.Millisecond, "a replica not heard for this long loses its L2 addresses to the others (the failover time when an LB host dies)")
	cmd.Flags().StringVar(&o.Engine, "engine", string(dataplane.EngineProxy), "data-plane engine of the frontends that name none: Proxy (user space, every feature), Kernel (in the kernel, by nftables or eBPF: see --kernel-path; needs CAP_NET_ADMIN and net.ipv4.ip_forward=1) or Auto (Kernel where the frontend needs no proxy feature)")
	cmd.Flags().BoolVar(&o.ProxyGoroutines, "proxy-goroutines", false, "move the proxy engine's TCP connections with two goroutines each over Go's net package instead of on its event loop (the way back while the event loop is new)")
	cmd.Flags().StringVar(&o.KernelTable, "kernel-table", dataplane.DefaultKernelTable, "nftables tables (families ip and ip6) of the kernel engine; they are left in place at exit, so that the kernel keeps forwarding until the next ebb lb replaces it")
	cmd.Flags().StringVar(&o.KernelPath, "kernel-path", string(dataplane.KernelPathNftables), "how the kernel engine forwards: nftables (DNAT and conntrack; TCP and UDP, IPv4 and IPv6, clients on this host too) or ebpf (a tc program with its own flow table, no conntrack: about half the CPU per new connection; IPv4 TCP from other hosts only; needs CAP_BPF, CAP_NET_ADMIN and a bpffs, mounted at /sys/fs/bpf if missing)")
	cmd.Flags().IntVar(&o.UDPFlows.Total, "udp-flows", dataplane.DefaultUDPFlows, "most UDP flows the proxy engine holds on all frontends together (each a socket and about 6 KiB); a datagram that would start one more is dropped and counted (ebb_dataplane_refused_total{reason=\"udp_flows_total\"})")
	cmd.Flags().IntVar(&o.UDPFlows.PerFrontend, "udp-flows-per-frontend", dataplane.DefaultUDPFlowsPerFrontend, "most UDP flows of one frontend, so that a flood of one leaves room for the others")
	cmd.Flags().IntVar(&o.UDPFlows.PerSource, "udp-flows-per-source", dataplane.DefaultUDPFlowsPerSource, "most UDP flows of one client address on one frontend (a client cycling source ports); clients behind one NAT address share it")
	cmd.Flags().StringVar(&o.BPFPinDir, "bpf-pin-dir", dataplane.DefaultBPFPinDir, "where --kernel-path=ebpf pins its maps and attachments: they stay at exit, so that the kernel keeps forwarding and the next ebb lb takes them over (on a hostPath in a pod)")
	cmd.Flags().StringArrayVar(&o.BPFInterfaces, "bpf-interface", nil, "an interface --kernel-path=ebpf forwards from, where clients' packets and backends' replies arrive (repeatable; default: every interface but lo, followed as interfaces come and go)")
	cmd.Flags().StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "the node this ebb lb runs on (default: $NODE_NAME, which config/lb sets from spec.nodeName): when it gets a leaving signal (NodeMaintenance, out-of-service, spot eviction, autoscaler, Karpenter, ...: --leaving-signals-file), this replica withdraws its announcements and reports its connections draining, until the taint goes")
	cmd.Flags().BoolVar(&o.ForwardMovedFlows, "forward-moved-flows", true, "when another LB host drains, send the TCP segments of its connections that the routers move here back to it (nftables table ip ebb-flows; needs CAP_NET_ADMIN), so they are not reset; cluster mode")
	cmd.Flags().DurationVar(&o.JoinForward, "join-forward", 5*time.Minute, "after this host starts announcing (first start, or its node no longer leaving), how long it sends the TCP segments of the other LB hosts' connections that the routers move to it back to them (connections older than that are reset when moved); 0: never")
	cmd.Flags().DurationVar(&o.WithdrawDelay, "withdraw-delay", time.Second, "when this host starts leaving or stopping, how long to wait before withdrawing its announcements, for the other LB hosts to start forwarding its connections")
	cmd.Flags().StringVar(&o.HandoffSocket, "handoff-socket", DefaultHandoffSocket, "Unix socket where a new ebb lb takes the listening sockets of the one running on this host, so that a restart or an upgrade drops no connection: a path, whose directory ebb lb makes 0700; auto: /run/ebb-lb/net-<inode of the network namespace>/handoff.sock; @NAME: in the network namespace's abstract namespace, open to every process there; empty: off")
	cmd.Flags().StringVar(&o.LegacyHandoffSocket, "handoff-legacy-socket", DefaultLegacyHandoffSocket, "where an ebb lb of a version before the path socket offers its sockets: asked only when nobody offers at --handoff-socket (the upgrade from such a version); empty: never")
	cmd.Flags().BoolVar(&o.ExitAfterHandoff, "exit-after-handoff", true, "exit once the sockets are handed to a successor and the established connections ended (false: wait for SIGTERM, as a pod must)")
	cmd.Flags().DurationVar(&o.BGP.GracefulRestartTime, "bgp-graceful-restart-time", 15*time.Second, "negotiate BGP graceful restart: how long the routers keep this host's routes when its session ends without a withdrawal, so a successor on the host takes over without the routes moving (0: off; then a hand-off withdraws the routes for a moment)")
	cmd.Flags().DurationVar(&o.ShutdownDelay, "shutdown-delay", 5*time.Second, "on SIGTERM, how long to keep accepting new connections after withdrawing the announcements (BGP, L2), while the routers move new flows to other hosts (without announcements: none)")
	cmd.Flags().DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 25*time.Second, "on SIGTERM, how long to keep serving established connections once no new ones are accepted; those left are then closed (keep shutdown-delay plus this under the pod's terminationGracePeriodSeconds)")
	cmd.Flags().DurationVar(&o.ReportHeartbeat, "report-heartbeat", 10*time.Second, "how often the report is renewed when nothing urgent changed")
	logFlags := flag.NewFlagSet("log", flag.ContinueOnError)
	zapOpts.BindFlags(logFlags)
	cmd.Flags().AddGoFlagSet(logFlags)
	return cmd
}

// Run serves until ctx is done.
func (o *Options) Run(ctx context.Context) error {
	if o.ConfigFile == "" {
		if err := lbmodel.ValidateClass(o.LoadBalancerClass); err != nil {
			return fmt.Errorf("--load-balancer-class: %w", err)
		}
	}
	if _, err := o.vipRanges(); err != nil {
		return err
	}
	log := logr.FromContextOrDiscard(ctx)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Before anything listens: the predecessor's sockets, if one runs.
	o.resolveHandoffSocket(log)
	taken := o.takeSockets(ctx, log)
	var inherited []*os.File
	if taken != nil {
		inherited = taken.Files
	}
	dp, err := dataplane.New(dataplane.Options{Registerer: reg, Logger: log.WithName("dataplane"), Engine: dataplane.Engine(o.Engine), KernelTable: o.KernelTable, KernelPath: dataplane.KernelPath(o.KernelPath), BPFPinDir: o.BPFPinDir, BPFInterfaces: o.BPFInterfaces, GoroutineProxy: o.ProxyGoroutines, UDPFlows: o.UDPFlows, Inherited: inherited})
	if err != nil {
		if taken != nil {
			taken.Abort()
		}
		return fmt.Errorf("starting the data plane (--engine, --kernel-path): %w", err)
	}
	if o.Engine != string(dataplane.EngineProxy) {
		if err := dataplane.CheckForwarding(); err != nil {
			log.Info("The kernel engine cannot forward flows from other hosts", "reason", err.Error())
		}
	}
	defer dp.Close()
	// The host kept forwarding for this process when a predecessor handed
	// over, or may have when an earlier one left the kernel engine's
	// state (a crash; a stop leaves it too, and then the routers hold
	// nothing of this host's and the restart costs nothing). Either way
	// the sessions open once this process applied its configuration
	// (takeOver), as a restart's.
	restarting := taken != nil
	if !restarting && dp.KernelStateLeft() {
		restarting = true
		log.Info("An earlier ebb lb left the kernel engine's state on this host, which forwards its flows: the BGP sessions open as a restart's once this process applied its configuration, so the routers keep the routes they hold for this host until it announced them again")
	}
	addrs, err := o.addresses(ctx, log, reg, restarting, dp.Ports)
	if err != nil {
		return err
	}
	// A host that stops serving withdraws its announcements, then stops
	// accepting the addresses (after the graceful stop, s.stop); one that
	// handed over leaves both to its successor.
	defer addrs.close(log)
	repair, err := newKernelRepair(log, reg, func() ([]string, error) {
		return repairParts(append(addrs.repairParts(), repairPart{"kernel", dp.RepairKernel}))
	})
	if err != nil {
		return err
	}
	go repair.run(ctx, repairEvery)
	h, err := newHandover(o.HandoffSocket, log, dp, addrs, taken, reg)
	if err != nil {
		return err
	}
	h.legacy = o.LegacyHandoffSocket
	// Runs before addrs.close: a successor that serves beside this process
	// without a hand-off keeps the routes and rules this one would remove.
	defer func() {
		if pid := h.successorBeside(); pid != 0 {
			log.Info("Leaving the local routes and the forwarding of moved flows to the ebb lb that serves beside this one", "pid", pid)
			addrs.retire()
		}
	}()
	// Runs before addrs.close: no hand-off may be half done then.
	defer h.settle(log, 0)
	s := &stopper{}
	if o.ConfigFile != "" {
		err = o.runFile(ctx, log, reg, dp, addrs, h, s)
	} else {
		err = o.runCluster(ctx, log, reg, dp, addrs, h, s, repair)
	}
	if h.handedOver() && !o.ExitAfterHandoff {
		log.Info("Handed over to a successor and served the established connections; waiting to be stopped")
		<-ctx.Done()
	}
	return err
}

// runFile serves the configuration file until ctx is done or a successor
// takes over, then stops gracefully.
func (o *Options) runFile(ctx context.Context, log logr.Logger, reg *prometheus.Registry, dp *dataplane.DataPlane, addrs *addressSinks, h *handover, s *stopper) error {
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ebb_lb_config_reloads_total", Help: "Configuration file loads; result is success or error.",
	}, []string{"result"})
	reg.MustRegister(reloads)
	// Before the first load, so a SIGHUP sent once the file serves reloads
	// it rather than ending the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	o.startL2Keys(ctx, log, addrs, nil)
	data, err := o.load(log, dp, addrs)
	if err != nil {
		return err // the first configuration must be valid
	}
	reloads.WithLabelValues("success").Inc()
	log.Info("Serving", "config", o.ConfigFile)
	stop, err := o.serveDebug(log, reg, nil, s.ready(func() bool { return h.ready() && !dp.KernelFailing() }))
	if err != nil {
		return err
	}
	defer stop()
	h.onHandOver = append(h.onHandOver, stop)
	follow, stopFollowing := context.WithCancel(ctx)
	defer stopFollowing()
	h.start(ctx, func() bool { return true }, stopFollowing)
	o.followFile(follow, log, dp, addrs, reloads, data, hup)
	h.settle(log, o.ShutdownTimeout)
	o.stopBeside(log, h, s, dp, addrs, stop)
	return nil
}

// runCluster serves the cluster's Services until ctx is done or a
// successor takes over, then stops gracefully.
func (o *Options) runCluster(ctx context.Context, log logr.Logger, reg *prometheus.Registry, dp *dataplane.DataPlane, addrs *addressSinks, h *handover, s *stopper, repair *kernelRepair) error {
	syncer, err := o.syncer(dp)
	if err != nil {
		return err
	}
	syncer.Registerer = reg
	syncer.Addresses = addrs
	o.startL2Keys(ctx, log, addrs, syncer.Client)
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: syncer.Client.EventsV1()})
	broadcaster.StartRecordingToSink(ctx.Done())
	defer broadcaster.Shutdown()
	syncer.Recorder = broadcaster.NewRecorder(scheme.Scheme, "ebb-lb")
	reporter, stopReport, err := o.startReport(ctx, log, dp, addrs, h)
	if err != nil {
		return err
	}
	defer stopReport()
	flows, err := o.startMovedFlows(ctx, log, reg, addrs)
	if err != nil {
		return err
	}
	if reporter != nil && flows != nil {
		s.drain = func() { reporter.SetDraining(true) }
	}
	join := &joinWindow{set: func(on bool, since time.Time) {
		flows.setJoining(on, since)
		if reporter != nil && flows != nil {
			reporter.SetJoining(on, since)
		}
	}}
	// A host that starts announcing takes some of the others' flows; one
	// that took over from a predecessor on the host does not.
	if h.taken == nil {
		join.open(o.JoinForward)
	}
	syncer.HostNode = o.NodeName
	if reporter != nil {
		syncer.CutOff, syncer.CutOffHold = reporter.CutOff, max(o.ReportHeartbeat, time.Second)
	}
	syncer.OnHostLeaving = func(leaving bool, reason string) {
		if leaving {
			log.Info("This node is leaving: withdrawing the announcements, serving the established connections", "node", o.NodeName, "reason", reason, "connections", dp.Connections())
			join.close()
		} else {
			log.Info("This node is no longer leaving: announcing again", "node", o.NodeName)
			join.open(o.JoinForward)
		}
		addrs.setWithdrawn(log, leaving)
		if reporter != nil {
			reporter.SetDraining(leaving)
		}
	}
	// The secure metrics' callers are reviewed by the API server: only
	// they need its configuration here.
	var cfg *rest.Config
	if o.SecureMetricsAddress != "" {
		if cfg, err = kubeconfig.Load(o.Kubeconfig); err != nil {
			return err
		}
	}
	stop, err := o.serveDebug(log, reg, cfg, s.ready(func() bool { return h.ready() && syncer.Ready() && !dp.KernelFailing() }))
	if err != nil {
		return err
	}
	defer stop()
	h.onHandOver = append(h.onHandOver, stop)
	if o.NodeName != "" {
		repair.setOnRepair(func(parts []string) { event.Publish(syncer.Recorder, kernelStateRepaired(o.NodeName, parts)) })
		h.onTookOver = func(predecessor, sockets int, err error) {
			if err != nil {
				event.Publish(syncer.Recorder, takeOverFailed(o.NodeName, o.ReportName, os.Getpid(), predecessor, err))
				return
			}
			event.Publish(syncer.Recorder, tookOver(o.NodeName, o.ReportName, os.Getpid(), predecessor, sockets))
		}
	}
	go func() {
		if err := o.followAnnouncementAPI(ctx, log, addrs, syncer); err != nil {
			log.Error(err, "Following the BGPPeers and AnnouncementPolicies: only --bgp-peer routers are peered with, every address is announced in every way")
		}
	}()
	log.Info("Serving the cluster's Services", "class", o.LoadBalancerClass)
	syncing, stopSyncing := context.WithCancel(ctx)
	defer stopSyncing()
	// Serving takes the L2 keys too: a successor that took over without
	// them would say nothing on the segment, and the other replicas would
	// take this host's addresses until the keys came.
	h.synced = syncer.Ready
	h.start(ctx, func() bool { return syncer.Ready() && addrs.l2Ready() }, stopSyncing)
	err = syncer.Run(syncing)
	h.settle(log, o.ShutdownTimeout)
	o.stopBeside(log, h, s, dp, addrs, stop)
	return err
}

// startReport starts publishing this replica's LoadBalancerReport (none
// without --report-name: a nil reporter). The report outlives ctx: it
// counts the connections down through the graceful stop; the returned
// function stops it and removes it, as the replica goes.
func (o *Options) startReport(ctx context.Context, log logr.Logger, dp *dataplane.DataPlane, addrs *addressSinks, h *handover) (*lbsync.Reporter, func(), error) {
	if o.ReportName == "" {
		return nil, func() {}, nil
	}
	reporter, err := o.reporter(dp)
	if err != nil {
		return nil, nil, err
	}
	reporter.Announcement = addrs.announcement
	reporter.Served = addrs.served
	h.onHandOver = append(h.onHandOver, reporter.Retire)
	reportCtx, stopReports := context.WithCancel(context.WithoutCancel(ctx))
	reported := make(chan struct{})
	go func() { reporter.Run(reportCtx); close(reported) }()
	return reporter, func() {
		stopReports()
		<-reported
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := reporter.Remove(rctx); err != nil {
			log.Error(err, "Removing this replica's report")
		}
	}, nil
}

// followFile applies the configuration file again when it changes (polled)
// or on SIGHUP, until ctx is done; a bad file keeps the running
// configuration and is reported once.
func (o *Options) followFile(ctx context.Context, log logr.Logger, dp *dataplane.DataPlane, addrs *addressSinks, reloads *prometheus.CounterVec, data []byte, hup <-chan os.Signal) {
	poll := time.NewTicker(o.PollInterval)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			log.Info("Stopping")
			return
		case <-hup:
		case <-poll.C:
			current, err := os.ReadFile(o.ConfigFile)
			// Unchanged: applied again only while some frontend could not
			// be served (its port may be free now).
			if err != nil || (bytes.Equal(current, data) && !o.incomplete) {
				continue
			}
		}
		next, err := o.load(log, dp, addrs)
		if err != nil {
			reloads.WithLabelValues("error").Inc()
			log.Error(err, "Keeping the running configuration", "config", o.ConfigFile)
			// Do not report the same bad file again until it changes.
			if bad, readErr := os.ReadFile(o.ConfigFile); readErr == nil {
				data = bad
			}
			continue
		}
		data = next
		reloads.WithLabelValues("success").Inc()
		log.Info("Applied the configuration", "config", o.ConfigFile)
	}
}

// syncer returns the Kubernetes-driven source of configuration.
func (o *Options) syncer(dp *dataplane.DataPlane) (*lbsync.Syncer, error) {
	cfg, err := kubeconfig.Load(o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("%w (give --config FILE to run without a cluster)", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating a client: %w", err)
	}
	return &lbsync.Syncer{Client: client, DataPlane: dp, Class: o.LoadBalancerClass, DefaultLoadBalancer: o.DefaultLoadBalancer, Model: o.Model}, nil
}

// reporter returns the writer of this replica's LoadBalancerReport.
func (o *Options) reporter(dp *dataplane.DataPlane) (*lbsync.Reporter, error) {
	cfg, err := kubeconfig.Load(o.Kubeconfig)
	if err != nil {
		return nil, err
	}
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, fmt.Errorf("creating a client for the load balancer report: %w", err)
	}
	return &lbsync.Reporter{Client: c, DataPlane: dp, Name: o.ReportName, Heartbeat: o.ReportHeartbeat, HostNode: o.NodeName}, nil
}

// defaultReportName is the pod's name (POD_NAME, from the downward API) or
// the host's.
func defaultReportName() string {
	if n := os.Getenv("POD_NAME"); n != "" {
		return n
	}
	n, _ := os.Hostname()
	return strings.ToLower(n)
}

// load reads, validates and applies the configuration file and returns its
// contents. An invalid or empty file is an error and changes nothing; a frontend
// that cannot be served (its port held by another process) is logged and
// skipped, and the others apply.
func (o *Options) load(log logr.Logger, dp *dataplane.DataPlane, addrs *addressSinks) ([]byte, error) {
	data, err := os.ReadFile(o.ConfigFile)
	if err != nil {
		return nil, fmt.Errorf("reading the configuration: %w", err)
	}
	// A file rewritten in place (`cat > FILE`, os.WriteFile) is empty for
	// a moment; applying that would drop every frontend.
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%s is empty (still being written?): write 'frontends: []' to serve nothing", o.ConfigFile)
	}
	cfg, err := dataplane.ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.ConfigFile, err)
	}
	res, err := dp.Apply(cfg)
	if err != nil {
		return nil, fmt.Errorf("applying %s: %w", o.ConfigFile, err)
	}
	for _, s := range res.Skipped {
		log.Error(s.Err, "Cannot serve a frontend; serving the others and trying again", "frontend", s.Name, "reason", s.Reason)
	}
	o.incomplete = len(res.Skipped) > 0
	if err := addrs.Sync(dp.Addresses()); err != nil {
		log.Error(err, "Making the load balancer's addresses local to this host, or announcing them")
		o.incomplete = true
	}
	return data, nil
}

// ipv6FromEnv is the first IPv6 address in NODE_IPS (the downward API's
// status.hostIPs, comma-separated), if any.
func ipv6FromEnv() netip.Addr {
	for _, s := range strings.Split(os.Getenv("NODE_IPS"), ",") {
		if a, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil && a.Is6() && !a.Is4In6() {
			return a
		}
	}
	return netip.Addr{}
}

// routerIDFromEnv is NODE_IP (the downward API's status.hostIP) when it is
// an IPv4 address.
func routerIDFromEnv() netip.Addr {
	a, err := netip.ParseAddr(os.Getenv("NODE_IP"))
	if err != nil || !a.Is4() {
		return netip.Addr{}
	}
	return a
}
