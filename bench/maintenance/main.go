// Command maintenance measures what node maintenance costs the apiserver at
// scale: API writes and reconciles per minute of `ebb controller` with many
// nodes, thousands of pods and several NodeMaintenances, while they drain
// and once they are drained (steady state, with unrelated pods coming and
// going elsewhere in the cluster). The last line printed is a JSON
// summary, also written to bench/results/maintenance.json.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/bench/internal/benchcluster"
	"github.com/ebbdev/ebb/bench/internal/report"
	"github.com/ebbdev/ebb/internal/demo"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// poolLabel marks the bench's bare nodes; its pods run only there.
const poolLabel = "bench.ebb.dev/pool"

type options struct {
	dist          string
	nodes, pods   int
	maintenances  int
	nodesEach     int
	steadyWindow  time.Duration
	churnInterval time.Duration
	out           string
}

func main() {
	var o options
	flag.StringVar(&o.dist, "dist", "dist", "where `make release` wrote install.yaml and the image layout oci, which the benchmark installs")
	flag.IntVar(&o.nodes, "nodes", 100, "nodes in the cluster (the local cluster's 3 plus bare simulated ones)")
	flag.IntVar(&o.pods, "pods", 3000, "pods on the bare nodes (10 Deployments)")
	flag.IntVar(&o.maintenances, "maintenances", 5, "NodeMaintenances")
	flag.IntVar(&o.nodesEach, "nodes-per-maintenance", 2, "nodes each maintenance drains")
	flag.DurationVar(&o.steadyWindow, "steady", 2*time.Minute, "how long the steady state is measured")
	flag.DurationVar(&o.churnInterval, "churn", 3*time.Second, "in the steady state, a Deployment on other nodes scales up or down by 10 this often")
	flag.StringVar(&o.out, "out", "bench/results/maintenance.json", "where to write the JSON summary")
	flag.Parse()
	benchcluster.Main("bench-maintenance", false, func() error { return run(o) })
}

func run(o options) error {
	ctx := context.Background()
	c, manifest, err := benchcluster.Start(ctx, o.dist, localcluster.Options{Name: "bench-maintenance", Nodes: 3})
	if err != nil {
		return err
	}
	defer c.Stop()
	// ebb installed without an LB node: no ebb lb reports on these nodes,
	// so a drain does not wait on load-balancer traffic, only on its
	// pods. The controller's client may send 200 requests/s (burst 400),
	// as an operator of a cluster this size would set it.
	err = ebbrun.InstallManifest(ctx, c, manifest, ebbrun.ManifestOptions{ControllerArgs: []string{"--kube-api-qps=200", "--kube-api-burst=400"}})
	if err != nil {
		return err
	}
	cl, err := client.New(c.Config, client.Options{Scheme: demo.Scheme()})
	if err != nil {
		return err
	}

	bare := o.nodes - len(c.Nodes)
	fmt.Fprintf(os.Stderr, "registering %d bare nodes\n", bare)
	nodes, err := c.AddBareNodes(ctx, "scale", bare, map[string]string{poolLabel: "scale"})
	if err != nil {
		return err
	}
	if len(nodes) < o.maintenances*o.nodesEach+1 {
		return fmt.Errorf("%d maintenances of %d nodes need more than %d bare nodes", o.maintenances, o.nodesEach, len(nodes))
	}
	const deployments = 10
	fmt.Fprintf(os.Stderr, "creating %d pods in %d Deployments\n", o.pods, deployments)
	start := time.Now()
	for i := range deployments {
		if err := cl.Create(ctx, hostNetworkDeployment(fmt.Sprintf("app-%d", i), int32(o.pods/deployments))); err != nil {
			return fmt.Errorf("creating Deployment app-%d: %w", i, err)
		}
	}
	for i := range deployments {
		if err := c.WaitDeploymentAvailable(ctx, metav1.NamespaceDefault, fmt.Sprintf("app-%d", i), 5*time.Minute); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "%d pods available in %s\n", o.pods, time.Since(start).Round(time.Second))

	// Draining: every maintenance created in Drain at once, until all are
	// Drained.
	start = time.Now()
	var names []string
	draining, err := measure(ctx, c, func() error {
		for i := range o.maintenances {
			nm := &v1alpha1.NodeMaintenance{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("scale-%d", i)},
				Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain, Reason: "bench-maintenance",
					NodeSelector: byName(nodes[i*o.nodesEach : (i+1)*o.nodesEach]...)},
			}
			if err := cl.Create(ctx, nm); err != nil {
				return fmt.Errorf("creating NodeMaintenance %s: %w", nm.Name, err)
			}
			names = append(names, nm.Name)
		}
		return waitDrained(ctx, cl, names, 10*time.Minute)
	})
	if err != nil {
		return err
	}
	drainTime := time.Since(start)
	draining = draining.perMinute(drainTime)
	fmt.Fprintf(os.Stderr, "draining %d nodes under %d maintenances took %s: %.0f writes/min, %.0f reconciles/min (nodemaintenance), %.0f (evacuation)\n",
		o.maintenances*o.nodesEach, o.maintenances, drainTime.Round(time.Second), draining.writes, draining.nodeMaintenanceReconciles, draining.evacuationReconciles)

	// Overlapping maintenances of every other stage on the drained nodes
	// (issue 41: two maintenances on a node used to flip its conditions
	// forever): a Cordon over two of them, an Idle over a third, and a
	// Drain with a plan of its own over a fourth and a fifth.
	overlaps, err := overlap(ctx, cl, names, o.nodesEach, nodes)
	if err != nil {
		return err
	}

	// Steady state: the maintenances are drained; elsewhere a Deployment
	// scales up and down.
	time.Sleep(5 * time.Second) // the last writes of the drain and their echoes
	var churned int
	steady, err := measure(ctx, c, func() error {
		var err error
		churned, err = churn(ctx, c, o.steadyWindow, o.churnInterval, "app-0", int32(o.pods/deployments))
		return err
	})
	if err != nil {
		return err
	}
	steady = steady.perMinute(o.steadyWindow)
	fmt.Fprintf(os.Stderr, "steady state over %s (%d scale changes of 10 pods elsewhere, %d overlapping maintenances in Cordon, Idle and Drain): %.1f writes/min, %.1f reconciles/min (nodemaintenance), %.1f (evacuation)\n",
		o.steadyWindow, churned, overlaps, steady.writes, steady.nodeMaintenanceReconciles, steady.evacuationReconciles)

	return report.WriteSummary(o.out, map[string]any{
		"date":                           time.Now().UTC().Format(time.RFC3339),
		"nodes":                          o.nodes,
		"pods":                           o.pods,
		"maintenances":                   o.maintenances,
		"drained_nodes":                  o.maintenances * o.nodesEach,
		"drain_s":                        drainTime.Seconds(),
		"draining_writes_per_minute":     draining.writes,
		"draining_reconciles_per_minute": draining.nodeMaintenanceReconciles,
		"draining_evacuation_reconciles_per_minute": draining.evacuationReconciles,
		"steady_writes_per_minute":                  steady.writes,
		"steady_reconciles_per_minute":              steady.nodeMaintenanceReconciles,
		"steady_evacuation_reconciles_per_minute":   steady.evacuationReconciles,
		"steady_scale_changes":                      churned,
		"steady_overlapping_maintenances":           overlaps,
		"leader_lease_writes_per_minute":            steady.leaseWrites,
	})
}

// hostNetworkDeployment runs replicas of the echo app on the bare nodes.
// Host network: the local cluster's pod servers leave such pods alone (a
// bare node has no host to run them on); kwok still runs their lifecycle.
// No container ports: on the host network they would be host ports, and
// at most one pod per node could have them.
func hostNetworkDeployment(name string, replicas int32) *appsv1.Deployment {
	dep := localcluster.EchoDeployment(metav1.NamespaceDefault, name, replicas)
	spec := &dep.Spec.Template.Spec
	spec.HostNetwork = true
	spec.NodeSelector = map[string]string{poolLabel: "scale"}
	spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
	spec.Containers[0].Ports = nil
	return dep
}

// byName selects nodes by name (matchFields on metadata.name takes one
// value per term).
func byName(names ...string) *corev1.NodeSelector {
	sel := &corev1.NodeSelector{}
	for _, n := range names {
		sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{
			Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{n},
		}}})
	}
	return sel
}

// overlap adds maintenances in Cordon, Idle and Drain (with a plan of its
// own) over the nodes the drained ones hold, waits for the new Drain to be
// Drained, and returns how many it added.
func overlap(ctx context.Context, cl client.Client, drained []string, nodesEach int, nodes []string) (int, error) {
	if len(drained) < 5 {
		return 0, nil
	}
	of := func(i int) []string { return nodes[i*nodesEach : (i+1)*nodesEach] }
	extra := []*v1alpha1.NodeMaintenance{
		{ObjectMeta: metav1.ObjectMeta{Name: "overlap-cordon"}, Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Cordon, Reason: "bench-maintenance overlap",
			NodeSelector: byName(append(of(0), of(1)...)...)}},
		{ObjectMeta: metav1.ObjectMeta{Name: "overlap-idle"}, Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Idle, Reason: "bench-maintenance overlap",
			NodeSelector: byName(of(2)...)}},
		{ObjectMeta: metav1.ObjectMeta{Name: "overlap-drain"}, Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain, Reason: "bench-maintenance overlap",
			DrainPlan:    []v1alpha1.DrainPlanEntry{{PodType: v1alpha1.Default, PodPriority: 5000}},
			NodeSelector: byName(append(of(3), of(4)...)...)}},
	}
	for _, nm := range extra {
		if err := cl.Create(ctx, nm); err != nil {
			return 0, fmt.Errorf("creating NodeMaintenance %s: %w", nm.Name, err)
		}
	}
	return len(extra), waitDrained(ctx, cl, []string{"overlap-drain"}, 5*time.Minute)
}

func waitDrained(ctx context.Context, cl client.Client, names []string, timeout time.Duration) error {
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		for _, name := range names {
			nm := &v1alpha1.NodeMaintenance{}
			if err := cl.Get(ctx, client.ObjectKey{Name: name}, nm); err != nil {
				return false, nil
			}
			if !meta.IsStatusConditionTrue(nm.Status.Conditions, v1alpha1.DrainedCondition) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %d maintenances to be Drained: %w", len(names), err)
	}
	return nil
}

// churn scales Deployment name between base and base+10 every interval
// for window, and returns how many times it scaled.
func churn(ctx context.Context, c *localcluster.Cluster, window, interval time.Duration, name string, base int32) (int, error) {
	deps := c.Client.AppsV1().Deployments(metav1.NamespaceDefault)
	n := 0
	for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(interval) {
		replicas := base
		if n%2 == 0 {
			replicas += 10
		}
		patch := fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas)
		if _, err := deps.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return n, fmt.Errorf("scaling %s: %w", name, err)
		}
		n++
	}
	return n, nil
}
