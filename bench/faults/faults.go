package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/localcluster"
)

// fault is one thing that goes wrong in the middle of a drain.
type fault struct {
	name string
	// about says what is done, for the output.
	about string
	// inject makes the fault and, for one that lasts, ends it; it returns
	// when the fault is over.
	inject func(ctx context.Context, f *faultEnv) error
}

// faultEnv is what a fault acts on.
type faultEnv struct {
	c *localcluster.Cluster
	// lbHost runs the ebb lb that serves the scenario's addresses.
	lbHost string
	// drained is the node the maintenance drains.
	drained string
	logf    func(format string, args ...any)
	// need is what the fault requires of ebb before it is whole again
	// (its since is set when the fault ends).
	need after
}

// faults are the issue's, in its order. The clock jump on an LB host is
// not among them: this machine has one wall clock for every node (a time
// namespace moves only the monotonic clocks, and only for processes that
// start in it), and jumping it would move the control plane's too.
var faults = []fault{
	{name: "controller-leader-killed", about: "the ebb controller leader killed (SIGKILL)", inject: killLeader},
	{name: "controllers-killed-20s", about: "both ebb controller replicas killed at once, and again whenever one starts, for 20 s", inject: killControllersFor(20 * time.Second)},
	{name: "lb-killed", about: "the ebb lb that serves killed (SIGKILL, not a graceful stop)", inject: killLB},
	{name: "node-agent-killed", about: "the drained node's ebb node-agent killed (SIGKILL)", inject: killNodeAgent},
	{name: "apiserver-down-60s", about: "kube-apiserver killed, started again 60 s later", inject: controlPlaneDown(localcluster.ComponentAPIServer, 60*time.Second)},
	{name: "etcd-down-30s", about: "etcd killed, started again 30 s later", inject: controlPlaneDown(localcluster.ComponentEtcd, 30*time.Second)},
	{name: "lb-host-cut-from-control-plane-60s", about: "the LB host cut off from the control plane (not from the clients or the nodes) for 60 s", inject: cutLBHost(60 * time.Second)},
}

// selectFaults picks the faults named in list (comma-separated; "all").
func selectFaults(list string) ([]fault, error) {
	if list == "all" {
		return faults, nil
	}
	var out []fault
	for _, name := range strings.Split(list, ",") {
		found := false
		for _, f := range faults {
			if f.name == strings.TrimSpace(name) {
				out = append(out, f)
				found = true
			}
		}
		if !found {
			var names []string
			for _, f := range faults {
				names = append(names, f.name)
			}
			return nil, fmt.Errorf("no fault %q (the faults: %s, or all)", name, strings.Join(names, ", "))
		}
	}
	return out, nil
}

// moment draws when, after the drain started, a fault is injected.
func moment(rng *rand.Rand, window time.Duration) time.Duration {
	if window <= 0 {
		return 0
	}
	return time.Duration(rng.Int64N(int64(window)))
}

const ebbNamespace = "ebb-system"

func ebbPods(ctx context.Context, c *localcluster.Cluster, name string) ([]corev1.Pod, error) {
	pods, err := c.Client.CoreV1().Pods(ebbNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + name})
	if err != nil {
		return nil, fmt.Errorf("listing the %s pods: %w", name, err)
	}
	return pods.Items, nil
}

// podOn is the pod of name on node.
func podOn(ctx context.Context, c *localcluster.Cluster, name, node string) (*corev1.Pod, error) {
	pods, err := ebbPods(ctx, c, name)
	if err != nil {
		return nil, err
	}
	for i := range pods {
		if pods[i].Spec.NodeName == node && pods[i].DeletionTimestamp == nil {
			return &pods[i], nil
		}
	}
	return nil, fmt.Errorf("no %s pod on %s", name, node)
}

func kill(f *faultEnv, pod *corev1.Pod) error {
	n, err := f.c.KillPod(pod)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("pod %s had no process to kill", pod.Name)
	}
	f.need.killed = append(f.need.killed, *pod)
	f.logf("killed %s (%d processes, on %s)", pod.Name, n, pod.Spec.NodeName)
	return nil
}

func killLeader(ctx context.Context, f *faultEnv) error {
	lease, err := f.c.Client.CoordinationV1().Leases(ebbNamespace).Get(ctx, "ebb-controller", metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the controller's Lease: %w", err)
	}
	// controller-runtime's identity is POD-NAME_UUID.
	name, _, _ := strings.Cut(ptr.Deref(lease.Spec.HolderIdentity, ""), "_")
	pod, err := f.c.Client.CoreV1().Pods(ebbNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("finding the leader %q: %w", name, err)
	}
	// Its last renewal stays fresh for the Lease's duration: only another
	// process's counts (a restarted one has a new identity).
	f.need.lease, f.need.notHolder = true, ptr.Deref(lease.Spec.HolderIdentity, "")
	return kill(f, pod)
}

func killControllersFor(d time.Duration) func(context.Context, *faultEnv) error {
	return func(ctx context.Context, f *faultEnv) error {
		kills := 0
		for end := time.Now().Add(d); time.Now().Before(end) && ctx.Err() == nil; {
			pods, err := ebbPods(ctx, f.c, "ebb-controller")
			if err != nil {
				return err
			}
			for i := range pods {
				// A replica kubelet has not started again has no process
				// to kill yet.
				if n, err := f.c.KillPod(&pods[i]); err == nil && n > 0 {
					kills++
					f.need.killed = append(f.need.killed, pods[i])
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		f.need.lease = true
		f.logf("killed ebb controller replicas %d times in %s", kills, d)
		if kills == 0 {
			return fmt.Errorf("no controller replica was found running to kill")
		}
		return nil
	}
}

func killLB(ctx context.Context, f *faultEnv) error {
	pod, err := podOn(ctx, f.c, "ebb-lb", f.lbHost)
	if err != nil {
		return err
	}
	f.need.reportsFrom = append(f.need.reportsFrom, f.lbHost)
	return kill(f, pod)
}

func killNodeAgent(ctx context.Context, f *faultEnv) error {
	pod, err := podOn(ctx, f.c, "ebb-node-agent", f.drained)
	if err != nil {
		return err
	}
	return kill(f, pod)
}

func controlPlaneDown(component string, d time.Duration) func(context.Context, *faultEnv) error {
	return func(ctx context.Context, f *faultEnv) error {
		restart, err := f.c.KillControlPlane(component)
		if err != nil {
			return err
		}
		f.logf("killed %s; starting it again in %s", component, d)
		f.need.lease, f.need.allReports = true, true
		sleep(ctx, d)
		return restart()
	}
}

func cutLBHost(d time.Duration) func(context.Context, *faultEnv) error {
	return func(ctx context.Context, f *faultEnv) error {
		heal, err := f.c.CutFromControlPlane(f.lbHost)
		if err != nil {
			return err
		}
		f.logf("cut %s off the control plane for %s", f.lbHost, d)
		f.need.reportsFrom = append(f.need.reportsFrom, f.lbHost)
		sleep(ctx, d)
		return heal()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
