package demo

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster"
)

// appKind is the scenario's app on the cluster's kind of nodes, and how
// its clients talk to it. On simulated nodes it is the echo servers' app
// (its answers name the serving node in JSON; raw TCP echo for long-lived
// connections). On real nodes (Options.RealKubelets) it is agnhost netexec
// run by the real kubelet: /hostname answers the pod's name, the node is
// found from the pod, and long-lived connections are HTTP keep-alive
// connections asking /echo, which netexec goes on serving for
// delayShutdown after SIGTERM, as an application that lets its clients
// finish does.
type appKind struct {
	real bool
}

func appKindOf(c *localcluster.Cluster) appKind { return appKind{real: c.RealKubelets()} }

// delayShutdown is how long the real app goes on serving after SIGTERM
// (netexec then exits at once, ending the connections it still has).
//
// Measured on real kubelets (bench-drain, 3 runs, 2026-11-26): 0 failed
// requests, and 0, 12 and 3 of about 540 long-lived connections ended by
// the app's exit ("unexpected EOF"): most likely connections a
// kube-proxy opened to the pod before it learned the pod was leaving.
// With 4 s here and a 10 s grace period, ebb's drain once failed 2,419 and
// 3,345 requests in two runs (timeouts awaiting headers, during the drain,
// before the node went down); not explained, so the app's longer window
// comes from preStop (realPreStop) instead.
const delayShutdown = 2

// realPreStop is the real app's preStop sleep: how long it goes on
// accepting after its pod is deleted, before SIGTERM. It must outlast the
// time every kube-proxy takes to learn that the endpoint is terminating
// (the EndpointSlice controller's update, then each proxy's sync), which a
// load balancer in front of node ports cannot shorten. Measured on this
// 2-core machine during the demo (2026-11-27, kube-proxy's
// kubeproxy_network_programming_duration_seconds, 3 nodes): 18 of 23
// changes programmed within 2 s, 21 within 4 s, the mean 2.0 s. With
// 2 s here (4 s of serving with delayShutdown), 2 of 3 demos failed 79 and
// 182 requests, all sent 3 to 5 s after an eviction and timing out on the
// pod that had just exited. 5 s gives 7 s of serving, in a grace period
// of 10 s.
const realPreStop, realGracePeriod = 5, 10

// deployment is the app's Deployment, with its preStop sleep.
func (a appKind) deployment(ns, name string, replicas int32) *appsv1.Deployment {
	if !a.real {
		d := localcluster.EchoDeployment(ns, name, replicas)
		d.Spec.Template.Spec.Containers[0].Lifecycle = preStopSleep(2)
		return d
	}
	d := localcluster.AgnhostDeployment(ns, name, replicas)
	d.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](realGracePeriod)
	c := &d.Spec.Template.Spec.Containers[0]
	c.Args = append(c.Args, fmt.Sprintf("--delay-shutdown=%d", delayShutdown))
	c.Lifecycle = preStopSleep(realPreStop)
	return d
}

// preStopSleep keeps a pod accepting for seconds after its deletion, as
// applications behind kube-proxy must to ride out the moment every proxy
// needs to learn that an endpoint left (any rolling update needs it).
func preStopSleep(seconds int64) *corev1.Lifecycle {
	return &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: seconds}}}
}

// path is what the clients ask for: an answer that names what served it.
func (a appKind) path() string {
	if a.real {
		return "/hostname"
	}
	return "/"
}

// serving names what served a request from its answer: nil keeps loadgen's
// default (the echo servers' JSON); on real nodes the pod's name, which
// tally turns into its node.
func (a appKind) serving() func([]byte) string {
	if !a.real {
		return nil
	}
	return func(body []byte) string { return string(body) }
}

// openLongLived opens one long-lived connection to the app at addr.
func (a appKind) openLongLived(dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string, interval time.Duration) (*loadgen.LongLived, error) {
	if a.real {
		return loadgen.OpenLongLivedHTTPVia(dial, addr, interval)
	}
	return loadgen.OpenLongLivedVia(dial, addr, interval)
}

// podNodes remembers the node of every pod of a namespace seen since it
// started, also of pods that are gone by the time the samples are
// tallied.
type podNodes struct {
	mu     sync.Mutex
	nodes  map[string]string
	cancel context.CancelFunc
	done   chan struct{}
}

// watchPodNodes starts following the pods of ns.
func watchPodNodes(ctx context.Context, client kubernetes.Interface, ns string) (*podNodes, error) {
	ctx, cancel := context.WithCancel(ctx)
	p := &podNodes{nodes: map[string]string{}, cancel: cancel, done: make(chan struct{})}
	list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("listing the pods of %s: %w", ns, err)
	}
	for i := range list.Items {
		p.record(&list.Items[i])
	}
	w, err := client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watching the pods of %s: %w", ns, err)
	}
	go func() {
		defer close(p.done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			if pod, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Error {
				p.record(pod)
			}
		}
	}()
	return p, nil
}

func (p *podNodes) record(pod *corev1.Pod) {
	if pod.Spec.NodeName == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nodes[pod.Name] = pod.Spec.NodeName
}

// node is the node pod ran on ("" if never seen scheduled).
func (p *podNodes) node(pod string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nodes[pod]
}

// stop ends the watch.
func (p *podNodes) stop() {
	p.cancel()
	<-p.done
}
