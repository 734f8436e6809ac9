package install_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

const ebbNamespace = "ebb-system"

// controllerPods lists the live ebb-controller pods by name.
func controllerPods(t *testing.T, ctx context.Context) map[string]corev1.Pod {
	t.Helper()
	pods, err := cluster.Client.CoreV1().Pods(ebbNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=ebb-controller"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]corev1.Pod{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Name] = p
		}
	}
	return out
}

// leader is the pod holding the controller's leader-election Lease
// (controller-runtime's identity is POD-NAME_UUID).
func leader(ctx context.Context) (string, error) {
	lease, err := cluster.Client.CoordinationV1().Leases(ebbNamespace).Get(ctx, "ebb-controller", metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	name, _, _ := strings.Cut(holder, "_")
	return name, nil
}

func ready(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Both replicas of dist/install.yaml run as processes of ebb's image, are
// Ready by their own probes, and exactly one of them leads.
func TestBothControllerReplicasRunOneLeads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pods := controllerPods(t, ctx)
	if len(pods) != 2 {
		t.Fatalf("%d controller pods, want the manifest's 2", len(pods))
	}
	for _, p := range pods {
		if !ready(p) || len(p.Status.ContainerStatuses) != 1 || !strings.Contains(p.Status.ContainerStatuses[0].ImageID, "@sha256:") {
			t.Errorf("pod %s: ready %v, statuses %+v", p.Name, ready(p), p.Status.ContainerStatuses)
		}
	}
	e2eutil.Eventually(t, ctx, 30*time.Second, "a leader among the replicas", func(ctx context.Context) (bool, string) {
		name, err := leader(ctx)
		if err != nil {
			return false, err.Error()
		}
		_, ok := pods[name]
		return ok, "lease held by " + name
	})
}

// The apiserver calls the webhooks through their Service, at the
// controller pods' addresses, over TLS with the CA the controller made:
// the mutating one fills in the default drain plan, the validating one
// refuses a maintenance that selects nothing, with its own words.
func TestWebhookAnswersThroughItsService(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := e2eutil.APIClient(t, cluster)
	bad := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "selects-nothing"},
		Spec:       v1alpha1.NodeMaintenanceSpec{NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{}}, Reason: "e2e"},
	}
	err := c.Create(ctx, bad)
	if err == nil || !strings.Contains(err.Error(), "denied the request") || !strings.Contains(err.Error(), "give at least one term") {
		t.Fatalf("creating a maintenance without selector terms: %v; want the webhook's refusal", err)
	}
	good := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "planned"},
		Spec:       v1alpha1.NodeMaintenanceSpec{NodeSelector: byName("node-3"), Stage: v1alpha1.Idle, Reason: "e2e"},
	}
	if err := c.Create(ctx, good); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), good) })
	if len(good.Spec.DrainPlan) == 0 {
		t.Fatalf("the created maintenance has no drain plan: the mutating webhook did not run")
	}
}

func byName(name string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{name}}},
	}}}
}

// A client on another subnet reaches a LoadBalancer Service through the
// router, served by the ebb lb pod of the DaemonSet on the LB node.
func TestClientReachesTheServiceThroughTheLBPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vip := e2eutil.DeployLoadBalancedEcho(t, ctx, cluster, ns, "web", 3).String()
	if err := cluster.RouteVIPsVia(netip.MustParseAddr(nodeIP(t, lbNode))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.RouteVIPs() })
	url := fmt.Sprintf("http://%s/", net.JoinHostPort(vip, "80"))
	httpClient := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cluster.ExternalClient.DialContext}}
	e2eutil.Eventually(t, ctx, 30*time.Second, "the client reaching "+url, func(ctx context.Context) (bool, string) {
		err := e2eutil.Answered(ctx, cluster, httpClient, url)
		return err == nil, fmt.Sprint(err)
	})
	served := map[string]int{}
	for i := range 30 {
		id, err := e2eutil.Identify(ctx, cluster, httpClient, url)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		served[id.Pod]++
	}
	if len(served) != 3 {
		t.Errorf("30 requests reached %d pods (%v), want all 3", len(served), served)
	}
	t.Logf("30 requests from the client through the router and ebb lb on %s: %v", lbNode, served)
}

// A dual-stack LoadBalancer Service gets an address of each family from
// the pool, and the client reaches the Service through the router on both.
func TestDualStackServiceAnswersOnBothAddresses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vips := e2eutil.DeployLoadBalancedEchoService(t, ctx, cluster, ns, "web", 2, func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
	})
	if len(vips) != 2 || !vips[0].Is4() || !vips[1].Is6() {
		t.Fatalf("a RequireDualStack Service got addresses %v, want an IPv4 and then an IPv6 one", vips)
	}
	if !localcluster.VIPCIDRv6.Contains(vips[1].AsSlice()) {
		t.Errorf("the IPv6 address %s is not from the pool's %s", vips[1], localcluster.VIPCIDRv6)
	}
	lb := nodeByName(t, lbNode)
	if err := cluster.RouteVIPsVia(netip.MustParseAddr(lb.IP), netip.MustParseAddr(lb.IPv6)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.RouteVIPs() })
	httpClient := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cluster.ExternalClient.DialContext}}
	for _, vip := range vips {
		url := fmt.Sprintf("http://%s/", net.JoinHostPort(vip.String(), "80"))
		e2eutil.Eventually(t, ctx, 30*time.Second, "the client reaching "+url, func(ctx context.Context) (bool, string) {
			err := e2eutil.Answered(ctx, cluster, httpClient, url)
			return err == nil, fmt.Sprint(err)
		})
		for i := range 10 {
			if err := e2eutil.Answered(ctx, cluster, httpClient, url); err != nil {
				t.Fatalf("request %d to %s: %v", i, url, err)
			}
		}
	}
}

func nodeIP(t *testing.T, name string) string {
	t.Helper()
	return nodeByName(t, name).IP
}

func nodeByName(t *testing.T, name string) localcluster.Node {
	t.Helper()
	n, ok := cluster.Node(name)
	if !ok {
		t.Fatalf("no node %s", name)
	}
	return n
}

// Killing the leading controller's pod hands leadership to the other
// replica, and a maintenance the leader had started finishes.
func TestLeaderLossDoesNotStopAMaintenance(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := e2eutil.APIClient(t, cluster)
	pods := controllerPods(t, ctx)
	var lead string
	e2eutil.Eventually(t, ctx, 30*time.Second, "a leader", func(ctx context.Context) (bool, string) {
		name, err := leader(ctx)
		_, ok := pods[name]
		lead = name
		return err == nil && ok, fmt.Sprint("lease held by ", name, err)
	})
	// Drain a node that runs no controller replica and no ebb lb, with two
	// pods of an app on it.
	target := ""
	for _, n := range cluster.Nodes {
		busy := n.Name == lbNode
		for _, p := range pods {
			busy = busy || p.Spec.NodeName == n.Name
		}
		if !busy {
			target = n.Name
		}
	}
	if target == "" {
		t.Fatal("no node without a controller replica or ebb lb")
	}
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	app := cluster.AppDeployment(ns, "app", 2)
	app.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: target}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, app, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitDeploymentAvailable(ctx, ns, "app", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: "failover"},
		Spec:       v1alpha1.NodeMaintenanceSpec{NodeSelector: byName(target), Stage: v1alpha1.Drain, Reason: "e2e leader failover", TrafficDrainTimeoutSeconds: ptr.To[int32](5)},
	}
	if err := c.Create(ctx, nm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), nm) })
	// The leader starts: the node is cordoned.
	e2eutil.Eventually(t, ctx, 30*time.Second, target+" cordoned by the leader", func(ctx context.Context) (bool, string) {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, target, metav1.GetOptions{})
		return err == nil && n.Spec.Unschedulable, "not cordoned"
	})
	// Kill the leader: no grace, so it cannot hand its lease over.
	if err := cluster.Client.CoreV1().Pods(ebbNamespace).Delete(ctx, lead, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// Either the surviving replica or the Deployment's replacement for the
	// killed one may win the expired lease: both try every retry period.
	var other string
	e2eutil.Eventually(t, ctx, time.Minute, "another replica to lead", func(ctx context.Context) (bool, string) {
		name, err := leader(ctx)
		other = name
		return err == nil && name != "" && name != lead, fmt.Sprint("lease held by ", name, err)
	})
	_, survivor := pods[other]
	t.Logf("%s (the surviving replica: %v) leads %s after %s was killed", other, survivor, time.Since(killed).Round(100*time.Millisecond), lead)
	e2eutil.Eventually(t, ctx, 2*time.Minute, "the maintenance to finish draining "+target, func(ctx context.Context) (bool, string) {
		got := &v1alpha1.NodeMaintenance{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(nm), got); err != nil {
			return false, err.Error()
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == v1alpha1.DrainedCondition && cond.Status == metav1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprintf("conditions %+v", got.Status.Conditions)
	})
	left, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: labels.Set{"app": "app"}.String(), FieldSelector: "spec.nodeName=" + target})
	if err != nil {
		t.Fatal(err)
	}
	// Evicted pods may still be ending (a real kubelet runs their
	// termination): what must not be left is a pod nobody evicted.
	notEvicted := 0
	for _, p := range left.Items {
		if p.DeletionTimestamp == nil {
			notEvicted++
		}
	}
	if notEvicted != 0 {
		t.Errorf("%d app pods on %s not evicted after Drained (%d listed)", notEvicted, target, len(left.Items))
	}
}

// A container that dies is restarted in its pod, as a kubelet does: the
// ebb lb process is killed, its pod counts a restart with the exit code of
// the kill, and is Ready again by its probe.
func TestACrashedLBContainerIsRestarted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pods, err := cluster.Client.CoreV1().Pods(ebbNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=ebb-lb"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("want one ebb-lb pod: %v, %v", err, pods)
	}
	pod := pods.Items[0]
	before := pod.Status.ContainerStatuses[0].RestartCount
	pid := containerPID(t, pod)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing ebb lb (pid %d): %v", pid, err)
	}
	e2eutil.Eventually(t, ctx, time.Minute, "ebb lb restarted and Ready", func(ctx context.Context) (bool, string) {
		p, err := cluster.Client.CoreV1().Pods(ebbNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		cs := p.Status.ContainerStatuses[0]
		last := cs.LastTerminationState.Terminated
		return cs.RestartCount == before+1 && ready(*p) && last != nil && last.ExitCode == 137,
			fmt.Sprintf("restarts %d, ready %v, last %+v", cs.RestartCount, ready(*p), last)
	})
}

// containerPID is the process ID of the pod's first container, found by
// the container's cgroup (its last element is the container's ID on real
// nodes, as containerd names it): the container's first process.
func containerPID(t *testing.T, pod corev1.Pod) int {
	t.Helper()
	_, id, ok := strings.Cut(pod.Status.ContainerStatuses[0].ContainerID, "://")
	if !ok || id == "" {
		t.Fatalf("pod %s reports no container ID: %q", pod.Name, pod.Status.ContainerStatuses[0].ContainerID)
	}
	cgroups, err := filepath.Glob("/proc/[0-9]*/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	first := 0
	for _, path := range cgroups {
		data, err := os.ReadFile(path)
		if err != nil || !strings.Contains(string(data), "/"+id+"\n") {
			continue // gone, or another process
		}
		pid, err := strconv.Atoi(strings.Split(path, "/")[2])
		if err == nil && (first == 0 || pid < first) {
			first = pid
		}
	}
	if first == 0 {
		t.Fatalf("no process in the cgroup of container %s of pod %s", id, pod.Name)
	}
	return first
}

// A deleted pod is gone from the API once its process has exited, as a
// kubelet removes it, not at the end of its grace period: a DaemonSet's
// or a Deployment's rollout waits on that.
func TestADeletedPodGoesOnceItsProcessExits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pods := controllerPods(t, ctx)
	var victim corev1.Pod
	for _, p := range pods {
		victim = p
		break
	}
	// A grace period far longer than the process takes to stop: the pod
	// must go when the process does.
	start := time.Now()
	if err := cluster.Client.CoreV1().Pods(ebbNamespace).Delete(ctx, victim.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](300)}); err != nil {
		t.Fatal(err)
	}
	e2eutil.Eventually(t, ctx, 20*time.Second, "the deleted pod gone from the API", func(ctx context.Context) (bool, string) {
		p, err := cluster.Client.CoreV1().Pods(ebbNamespace).Get(ctx, victim.Name, metav1.GetOptions{})
		if err != nil {
			return strings.Contains(err.Error(), "not found"), err.Error()
		}
		return p.UID != victim.UID, "still there, deleting since " + p.DeletionTimestamp.String()
	})
	t.Logf("pod %s gone %s after its deletion with a 300 s grace period", victim.Name, time.Since(start).Round(100*time.Millisecond))
	e2eutil.Eventually(t, ctx, time.Minute, "two Ready controller replicas again", func(ctx context.Context) (bool, string) {
		n := 0
		for _, p := range controllerPods(t, ctx) {
			if ready(p) {
				n++
			}
		}
		return n == 2, fmt.Sprintf("%d Ready", n)
	})
}
