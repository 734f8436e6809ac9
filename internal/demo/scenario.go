// Package demo is ebb's main scenario, shared by `ebb demo` and the drain
// benchmark: on a running local cluster, two apps behind ebb.dev/l4
// LoadBalancer Services (a Deployment of several replicas and a single
// replica that opts in to the surge evacuator) take constant traffic while
// one node is drained, taken down for its maintenance and brought back.
// With ebb, a NodeMaintenance drains the load balancers first; the
// baseline does what clusters do today: cordon, evict with kubectl's drain
// library, and a load balancer that learns only from its health probes.
package demo

import (
	"context"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster"
)

// Options shape the scenario.
type Options struct {
	// Baseline runs the scenario the way clusters do it today.
	Baseline bool
	// Replicas of the multi-replica app.
	Replicas int32
	// Rate is the total of new connections per second (two thirds to the
	// multi-replica app, one third to the single replica).
	Rate int
	// LongLived connections are kept open, each for LongLivedLifetime,
	// then replaced by a new one (as clients with keep-alive do). The
	// lifetime stays under the pods' grace period (5 s, whole seconds, so
	// up to 1 s less): no load balancer can keep a connection that outlives
	// its pod's termination, and with externalTrafficPolicy Cluster any
	// node's kube-proxy may have opened one to a pod just before its
	// eviction.
	LongLived         int
	LongLivedLifetime time.Duration
	// Settle is the quiet time before the drain and after Complete.
	Settle time.Duration
	// Downtime is how long the node is down for its maintenance.
	Downtime time.Duration
	// Namespace of the apps (one per run).
	Namespace string
	Progress  io.Writer
	// Dial opens the clients' connections (nil: from this process's
	// host), e.g. from the client host behind the router.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// AppNodes, when set, are the only nodes the apps run on (the others,
	// LB hosts, take none of their pods), and the nodes the report shows.
	AppNodes []string
	// DuringDrain, when set, runs beside the scenario from the moment the
	// drain of node started (the NodeMaintenance exists, or the node is
	// cordoned), e.g. to inject a fault; Run returns once it has returned
	// too. The scenario's own API calls wait out an API server that does
	// not answer meanwhile.
	DuringDrain func(ctx context.Context, node string)
}

// DefaultOptions are the demo's.
func DefaultOptions() Options {
	return Options{Replicas: 6, Rate: 200, LongLived: 10, LongLivedLifetime: 3 * time.Second, Settle: 3 * time.Second, Downtime: 15 * time.Second}
}

// Markers are the moments of the scenario, from the start of the traffic.
type Markers struct {
	Drain, FirstEviction, Drained, NodeDown, NodeUp, Complete, End time.Duration
}

// Result is what the clients noticed and what the cluster did.
type Result struct {
	Mode           string
	Node           string
	RequestsSent   int64
	RequestsFailed int64
	// ResetConnections counts long-lived connections that broke.
	ResetConnections int64
	LongLivedOpened  int64
	// CutoverMs is from the start of the drain to the last new connection
	// the node accepted before it came back.
	CutoverMs float64
	// DrainSeconds is from the start of the drain to Drained (ebb) or to
	// the drain library returning (baseline).
	DrainSeconds float64
	// P99Ms is the 99th percentile latency of requests sent between the
	// start of the drain and the node coming back.
	P99Ms float64
	// LastError is the last failed request's error.
	LastError string
	Markers   Markers
	// Samples are every request, for the per-node figures and the chart.
	Samples []loadgen.Sample
	Nodes   []string
}

// Run runs the scenario against c, with ebb (controller and lb) already
// running as the mode needs.
func Run(ctx context.Context, c *localcluster.Cluster, o Options) (*Result, error) {
	s := &scenario{c: c, o: o, progress: o.Progress, kind: appKindOf(c)}
	if s.progress == nil {
		s.progress = io.Discard
	}
	return s.run(ctx)
}

type scenario struct {
	c        *localcluster.Cluster
	o        Options
	progress io.Writer
	kind     appKind
	// pods maps the apps' pods to their nodes (real nodes: the answers
	// name pods).
	pods *podNodes
	// duringDrain is closed when Options.DuringDrain has returned.
	duringDrain chan struct{}
}

// drainStarted starts Options.DuringDrain.
func (s *scenario) drainStarted(ctx context.Context, node string) {
	if s.o.DuringDrain == nil {
		return
	}
	s.duringDrain = make(chan struct{})
	go func() {
		defer close(s.duringDrain)
		s.o.DuringDrain(ctx, node)
	}()
}

// waitDuringDrain waits for Options.DuringDrain to return.
func (s *scenario) waitDuringDrain() {
	if s.duringDrain != nil {
		<-s.duringDrain
	}
}

func (s *scenario) step(format string, args ...any) {
	fmt.Fprintf(s.progress, "[demo] "+format+"\n", args...)
}

func (s *scenario) run(ctx context.Context) (*Result, error) {
	mode := "ebb"
	if s.o.Baseline {
		mode = "baseline"
	}
	res := &Result{Mode: mode}
	// Whatever ends the run, Options.DuringDrain has returned by then.
	defer s.waitDuringDrain()
	res.Nodes = s.o.AppNodes
	if len(res.Nodes) == 0 {
		for _, n := range s.c.Nodes {
			res.Nodes = append(res.Nodes, n.Name)
		}
	}
	ns := s.o.Namespace
	webURL, soloURL, err := s.deploy(ctx, res)
	if err != nil {
		return nil, err
	}
	if s.pods, err = watchPodNodes(ctx, s.c.Client, ns); err != nil {
		return nil, err
	}
	defer s.pods.stop()

	s.step("%s: sending %d new connections/s and keeping %d long-lived connections", mode, s.o.Rate, s.o.LongLived)
	web := &loadgen.Requests{URL: webURL + s.kind.path(), Rate: max(s.o.Rate*2/3, 1), Dial: s.o.Dial, Serving: s.kind.serving()}
	solo := &loadgen.Requests{URL: soloURL + s.kind.path(), Rate: max(s.o.Rate/3, 1), Dial: s.o.Dial, Serving: s.kind.serving()}
	web.Start()
	solo.Start()
	long := startLongLived(s.o.Dial, s.kind.openLongLived, webURL[len("http://"):], s.o.LongLived, s.o.LongLivedLifetime)
	origin := time.Now()
	since := func() time.Duration { return time.Since(origin) }
	sleep(ctx, s.o.Settle)

	m := &res.Markers
	m.Drain = since()
	drainer := s.ebbDrain
	if s.o.Baseline {
		drainer = s.baselineDrain
	}
	drainEnd, complete, err := drainer(ctx, ns, res.Node, since, m)
	if err != nil {
		web.Stop()
		solo.Stop()
		long.stop()
		return nil, err
	}
	m.Drained = drainEnd
	res.DrainSeconds = (drainEnd - m.Drain).Seconds()

	if err := s.takeDown(ctx, res, origin); err != nil {
		return nil, err
	}

	s.step("%s: %s is back; completing the maintenance", mode, res.Node)
	if err := complete(ctx); err != nil {
		return nil, err
	}
	m.Complete = since()
	s.waitDuringDrain()
	sleep(ctx, s.o.Settle)
	web.Stop()
	solo.Stop()
	long.stop()
	m.End = since()

	s.tally(res, origin, long, web, solo)
	s.step("%s: %d requests, %d failed; %d long-lived connections, %d reset", mode, res.RequestsSent, res.RequestsFailed, res.LongLivedOpened, res.ResetConnections)
	if why := long.lastBroken(); why != "" {
		s.step("%s: the last long-lived connection broke at %s", mode, why)
	}
	if res.RequestsFailed > 0 {
		s.step("%s: %s", mode, res.Failures())
	}
	if slow := res.SlowRequests(); slow != "" {
		s.step("%s: %s", mode, slow)
	}
	return res, nil
}

// Failures says when requests failed, against the scenario's moments, and
// the last error ("" when none failed).
func (res *Result) Failures() string {
	if res.RequestsFailed == 0 {
		return ""
	}
	m := &res.Markers
	return fmt.Sprintf("failures %s (drain at %s, first eviction %s, drained %s, node down %s, up %s, complete %s); last error: %s",
		failureSpan(res.Samples), m.Drain.Round(time.Millisecond), m.FirstEviction.Round(time.Millisecond), m.Drained.Round(time.Millisecond),
		m.NodeDown.Round(time.Millisecond), m.NodeUp.Round(time.Millisecond), m.Complete.Round(time.Millisecond), res.LastError)
}

// deploy creates the namespace and the two apps behind ebb's Services,
// and records the node to maintain: the one the single replica runs on.
func (s *scenario) deploy(ctx context.Context, res *Result) (webURL, soloURL string, err error) {
	ns := s.o.Namespace
	if _, err := s.c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return "", "", fmt.Errorf("creating namespace %s: %w", ns, err)
	}
	s.step("%s: deploying web (%d replicas) and solo (1 replica, surge evacuation) behind %s LoadBalancer Services", res.Mode, s.o.Replicas, lbmodel.ClassL4)
	if webURL, err = s.app(ctx, ns, "web", s.o.Replicas, false); err != nil {
		return "", "", err
	}
	if soloURL, err = s.app(ctx, ns, "solo", 1, true); err != nil {
		return "", "", err
	}
	pods, err := s.c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=solo"})
	if err != nil || len(pods.Items) == 0 {
		return "", "", fmt.Errorf("finding the single replica: %v", err)
	}
	res.Node = pods.Items[0].Spec.NodeName
	return webURL, soloURL, nil
}

// takeDown cuts the drained node off the node network for its downtime,
// as a machine being maintained, and records when the load balancer last
// sent it a new connection.
func (s *scenario) takeDown(ctx context.Context, res *Result, origin time.Time) error {
	m := &res.Markers
	s.step("%s: %s is down for its maintenance (%s): its host is cut off the node network", res.Mode, res.Node, s.o.Downtime)
	m.NodeDown = time.Since(origin)
	if err := s.c.Disconnect(res.Node); err != nil {
		return err
	}
	sleep(ctx, s.o.Downtime)
	lastAccept := s.c.LastNewConnection(res.Node)
	if err := s.c.Reconnect(res.Node); err != nil {
		return err
	}
	m.NodeUp = time.Since(origin)
	res.CutoverMs = float64(max(lastAccept.Sub(origin)-m.Drain, 0).Microseconds()) / 1000
	return nil
}

// tally adds up what the clients saw.
func (s *scenario) tally(res *Result, origin time.Time, long *longLived, gens ...*loadgen.Requests) {
	for _, g := range gens {
		sent, failed := g.Counts()
		res.RequestsSent += sent
		res.RequestsFailed += failed
		if failed > 0 {
			res.LastError = g.LastError()
		}
		res.Samples = append(res.Samples, shift(g.Samples(), g.Started().Sub(origin))...)
	}
	if s.kind.real {
		// The answers named pods: count each request for its pod's node.
		for i := range res.Samples {
			if res.Samples[i].Node != "" {
				res.Samples[i].Node = s.pods.node(res.Samples[i].Node)
			}
		}
	}
	res.ResetConnections, res.LongLivedOpened = long.resets.Load(), long.opened.Load()
	res.P99Ms = p99(res.Samples, res.Markers.Drain, res.Markers.NodeUp)
}

// app deploys the echo app behind an ebb load balancer and returns its URL
// once it answers.
func (s *scenario) app(ctx context.Context, ns, name string, replicas int32, single bool) (string, error) {
	dep := s.c.GracefulAppDeployment(ns, name, replicas)
	if single {
		dep.Annotations = map[string]string{v1alpha1.SurgeEvacuationAnnotation: "true"}
	}
	if len(s.o.AppNodes) > 0 {
		dep.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: s.o.AppNodes}},
			}}},
		}}
	}
	if _, err := s.c.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("creating Deployment %s: %w", name, err)
	}
	svc := localcluster.EchoService(ns, name, corev1.ServiceTypeLoadBalancer)
	svc.Spec.LoadBalancerClass = ptr.To(lbmodel.ClassL4)
	if _, err := s.c.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("creating Service %s: %w", name, err)
	}
	if err := s.c.WaitDeploymentAvailable(ctx, ns, name, 2*time.Minute); err != nil {
		return "", err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		svc, err := s.c.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && len(svc.Status.LoadBalancer.Ingress) > 0 {
			url := "http://" + net.JoinHostPort(svc.Status.LoadBalancer.Ingress[0].IP, "80")
			if (&loadgen.Requests{URL: url + s.kind.path(), Dial: s.o.Dial}).Probe() == nil {
				return url, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the Service %s did not answer through its load balancer within a minute (logs in %s/logs)", name, s.c.Dir())
		}
		sleep(ctx, 100*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// failureSpan says when requests failed: from the first to the last
// failure, and how many fell in each second.
func failureSpan(samples []loadgen.Sample) string {
	perSecond := map[int]int{}
	var secs []int
	for _, s := range samples {
		if s.Failed {
			i := int(s.At.Seconds())
			if perSecond[i] == 0 {
				secs = append(secs, i)
			}
			perSecond[i]++
		}
	}
	sort.Ints(secs)
	var parts []string
	for _, i := range secs {
		parts = append(parts, fmt.Sprintf("%ds:%d", i, perSecond[i]))
	}
	return strings.Join(parts, " ")
}

// shift moves samples from their generator's clock to the scenario's.
func shift(samples []loadgen.Sample, by time.Duration) []loadgen.Sample {
	for i := range samples {
		samples[i].At += by
	}
	return samples
}
