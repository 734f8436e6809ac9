package kubelet_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/appclient"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// preStopSeconds is how long the app's preStop hook runs: longer than every
// kube-proxy and ebb lb take to learn the endpoint is terminating, as an
// application behind kube-proxy needs (README).
const preStopSeconds = 8

// delayShutdownSeconds is how long agnhost netexec goes on serving after
// SIGTERM (its --delay-shutdown).
const delayShutdownSeconds = 2

// lateAfter is when, after its endpoint turned terminating, a new
// connection to the leaving pod counts as the load balancer's fault: half
// its preStop, far above what every proxy takes to learn it, so that a busy
// machine does not fail the test, and far below what the pod goes on
// serving, so that a load balancer that ignored the change does.
const lateAfter = preStopSeconds * time.Second / 2

// TestAPodDeletedThroughARealKubeletGetsNoNewConnection deletes one pod of
// a load-balanced agnhost Deployment under a stream of new connections
// from the client behind the router, and checks what the real kubelet and
// ebb do with it:
//   - kubelet runs the preStop hook (an exec that calls the app, then
//     sleeps), and sends SIGTERM only once the hook has ended;
//   - once the pod's endpoint is terminating, the load balancer sends it no
//     new connection, though the pod goes on answering for several seconds;
//   - no request fails.
func TestAPodDeletedThroughARealKubeletGetsNoNewConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	vip := e2eutil.DeployLoadBalancedEcho(t, ctx, cluster, ns, "web", 3, agnhostWithPreStop)
	if err := cluster.RouteVIPsVia(netip.MustParseAddr(nodeIP(t, lbNode))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.RouteVIPs() })
	url := fmt.Sprintf("http://%s/hostname", net.JoinHostPort(vip.String(), "80"))
	// The load starts once the route just set answers: a clean-clone CI
	// run's first requests, 1 ms after the route was set, got "no route to
	// host" (the router had not yet resolved the LB host), which is set-up,
	// not the leaving pod this test is about.
	probe := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cluster.ExternalClient.DialContext}}
	e2eutil.Eventually(t, ctx, 30*time.Second, "the address answering through the LB host", func(ctx context.Context) (bool, string) {
		_, err := appclient.Hostname(ctx, probe, url)
		return err == nil, fmt.Sprint(err)
	})

	load := startHostnameLoad(t, ctx, url, 4)
	pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	e2eutil.Eventually(t, ctx, 30*time.Second, "every pod serving through the load balancer", func(context.Context) (bool, string) {
		served := load.servedBy()
		return len(served) == len(pods.Items), fmt.Sprintf("served by %v", served)
	})
	victim := pods.Items[0]
	logs := followLogs(t, ctx, ns, victim.Name)
	terminating := watchTerminating(t, ctx, ns, "web", victim.Status.PodIP)

	t.Logf("deleting pod %s (%s) on %s", victim.Name, victim.Status.PodIP, victim.Spec.NodeName)
	deleted := time.Now()
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, victim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var terminatingAt time.Time
	select {
	case terminatingAt = <-terminating:
	case <-ctx.Done():
		t.Fatal("the pod's endpoint never turned terminating")
	}
	t.Logf("its endpoint turned terminating %s after the delete", terminatingAt.Sub(deleted).Round(time.Millisecond))
	waitPodGone(t, ctx, ns, victim.Name)
	gone := time.Now()
	time.Sleep(time.Second)
	load.Halt()

	// kubelet's order: the hook, then (only after it ended) SIGTERM.
	lines := logs()
	hookAt, termAt := logTime(t, lines, "GET /echo?msg=prestop"), logTime(t, lines, "before terminating")
	t.Logf("pod %s: preStop called the app at %s, SIGTERM came %s later, the pod was gone %s after the delete",
		victim.Name, hookAt.Format("15:04:05.000"), termAt.Sub(hookAt).Round(time.Millisecond), gone.Sub(deleted).Round(time.Millisecond))
	if termAt.Sub(hookAt) < (preStopSeconds-1)*time.Second {
		t.Errorf("SIGTERM came %s after the preStop hook started, before the hook's %d s sleep could end", termAt.Sub(hookAt), preStopSeconds)
	}

	results := load.results()
	late := tally(t, results, victim.Name, terminatingAt)
	t.Logf("%d requests, %d failed; the last new connection reached the leaving pod %s after its endpoint turned terminating", len(results), late.failed, late.last.Sub(terminatingAt).Round(time.Millisecond))
	if late.failed > 0 {
		t.Errorf("%d of %d requests failed", late.failed, len(results))
	}
	if late.toVictim > 0 {
		t.Errorf("%d new connections reached the leaving pod more than %s after its endpoint turned terminating", late.toVictim, lateAfter)
	}
}

// lateCount is what tally found.
type lateCount struct {
	failed, toVictim int
	// last is when the last request that reached the victim started.
	last time.Time
}

// tally counts the failed requests (reporting the first few) and those
// that reached victim though they started lateAfter or more after its
// endpoint turned terminating.
func tally(t *testing.T, results []hostnameResult, victim string, terminatingAt time.Time) lateCount {
	t.Helper()
	var c lateCount
	for _, r := range results {
		if r.err != nil {
			c.failed++
			if c.failed <= 5 {
				t.Errorf("request at %s failed: %v", r.start.Format("15:04:05.000"), r.err)
			}
			continue
		}
		if r.host != victim {
			continue
		}
		if r.start.After(c.last) {
			c.last = r.start
		}
		// Every kube-proxy and ebb lb learn of the terminating endpoint
		// within a second here (0.75 s measured); the pod serves for
		// preStopSeconds and delayShutdownSeconds more, so a load balancer
		// that kept sending it new connections shows in the second half
		// of its preStop.
		if r.start.After(terminatingAt.Add(lateAfter)) {
			c.toVictim++
		}
	}
	return c
}

// agnhostWithPreStop makes the echo Deployment's pods agnhost netexec with
// a preStop hook that calls the app (so that the pod's log shows when it
// ran) and then sleeps, and a shutdown delay after SIGTERM.
func agnhostWithPreStop(d *appsv1.Deployment) {
	app := localcluster.AgnhostDeployment(d.Namespace, d.Name, 1).Spec.Template.Spec.Containers[0]
	app.Args = append(app.Args, fmt.Sprintf("--delay-shutdown=%d", delayShutdownSeconds))
	app.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{
		"/bin/sh", "-c", fmt.Sprintf("wget -q -O /dev/null 'http://127.0.0.1:8080/echo?msg=prestop'; sleep %d", preStopSeconds),
	}}}}
	d.Spec.Template.Spec.Containers[0] = app
	d.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](30)
}

// hostnameResult is one request of the load: when it started, which pod
// answered, or how it failed.
type hostnameResult struct {
	start time.Time
	host  string
	err   error
}

// hostnameLoad sends GET /hostname, each on a new connection, from the
// client behind the router, and keeps every result (e2eutil.Load runs and
// halts its workers).
type hostnameLoad struct {
	*e2eutil.Load
	mu  sync.Mutex
	all []hostnameResult
}

func startHostnameLoad(t *testing.T, ctx context.Context, url string, workers int) *hostnameLoad {
	l := &hostnameLoad{Load: e2eutil.NewLoad(t)}
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cluster.ExternalClient.DialContext}}
	for range workers {
		l.Go(func() {
			for !l.Stopped() {
				r := hostnameResult{start: time.Now()}
				r.host, r.err = appclient.Hostname(ctx, client, url)
				l.mu.Lock()
				l.all = append(l.all, r)
				l.mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	return l
}

func (l *hostnameLoad) results() []hostnameResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]hostnameResult(nil), l.all...)
}

// servedBy counts the answers per pod so far.
func (l *hostnameLoad) servedBy() map[string]int {
	served := map[string]int{}
	for _, r := range l.results() {
		if r.err == nil {
			served[r.host]++
		}
	}
	return served
}

// followLogs streams a pod's log with kubelet's timestamps (`kubectl logs
// -f --timestamps`) until its container ends; the returned function waits
// for that and returns the lines.
func followLogs(t *testing.T, ctx context.Context, ns, pod string) func() []string {
	t.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join(cluster.BinDir, "kubectl"), "--kubeconfig", cluster.Kubeconfig, "-n", ns, "logs", "-f", "--timestamps", pod)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		s := bufio.NewScanner(out)
		for s.Scan() {
			lines = append(lines, s.Text())
		}
	}()
	return func() []string {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("kubectl logs -f %s did not end with the container", pod)
			_ = cmd.Process.Kill()
			<-done
		}
		_ = cmd.Wait()
		return lines
	}
}

// logTime is kubelet's timestamp of the first log line containing substr.
func logTime(t *testing.T, lines []string, substr string) time.Time {
	t.Helper()
	for _, l := range lines {
		stamp, text, ok := strings.Cut(l, " ")
		if !ok || !strings.Contains(text, substr) {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, stamp)
		if err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		return at
	}
	t.Fatalf("no log line contains %q:\n%s", substr, strings.Join(lines, "\n"))
	return time.Time{}
}

// watchTerminating sends the time at which the Service's EndpointSlices
// first show the endpoint at ip terminating (as every kube-proxy and ebb
// lb learn it).
func watchTerminating(t *testing.T, ctx context.Context, ns, svc, ip string) <-chan time.Time {
	t.Helper()
	w, err := cluster.Client.DiscoveryV1().EndpointSlices(ns).Watch(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
	if err != nil {
		t.Fatal(err)
	}
	at := make(chan time.Time, 1)
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			slice, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok {
				continue
			}
			for _, ep := range slice.Endpoints {
				if len(ep.Addresses) > 0 && ep.Addresses[0] == ip && ptr.Deref(ep.Conditions.Terminating, false) {
					at <- time.Now()
					return
				}
			}
		}
	}()
	return at
}

// waitPodGone waits until the pod object is deleted (its containers ended).
func waitPodGone(t *testing.T, ctx context.Context, ns, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s is not gone: %v", ns, name, err)
	}
}

// nodeIP is a node's IPv4 InternalIP, from the cluster's plan.
func nodeIP(t *testing.T, name string) string {
	t.Helper()
	n, ok := cluster.Node(name)
	if !ok {
		t.Fatalf("the cluster has no node %s", name)
	}
	return n.IP
}
