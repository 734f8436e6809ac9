package demo

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/appclient"
)

// appKind is the scenario's app on the cluster's kind of nodes, and how
// its clients talk to it. On simulated nodes it is the echo servers' app
// (its answers name the serving node in JSON; raw TCP echo for long-lived
// connections). On real nodes (Options.RealKubelets) it is agnhost netexec
// run by the real kubelet: /hostname answers the pod's name, the node is
// found from the pod, and long-lived connections are HTTP keep-alive
// connections asking /echo, which netexec goes on serving for a moment
// after SIGTERM, as an application that lets its clients finish does
// (localcluster's GracefulAppDeployment).
type appKind struct {
	real bool
}

func appKindOf(c *localcluster.Cluster) appKind { return appKind{real: c.RealKubelets()} }

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
	return appclient.OpenLongLived(dial, a.real, addr, interval)
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
