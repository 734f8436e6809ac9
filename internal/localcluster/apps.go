package localcluster

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/localcluster/nodeimage"
)

// EchoDeployment is a Deployment whose pods the cluster serves with its
// echo servers: HTTP (and raw TCP echo) on port 8080, UDP echo on 8081.
func EchoDeployment(namespace, name string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					Containers: []corev1.Container{{
						Name:  "echo",
						Image: "ebb.dev/echo:local", // never pulled: kwok runs no containers
						Ports: []corev1.ContainerPort{
							{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
							{Name: "udp", ContainerPort: 8081, Protocol: corev1.ProtocolUDP},
						},
					}},
				},
			},
		},
	}
}

// EchoService is a Service of the given type in front of EchoDeployment's
// pods, with ports "http" (TCP 80 -> 8080) and "udp" (UDP 81 -> 8081).
func EchoService(namespace, name string, typ corev1.ServiceType) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.ServiceSpec{
			Type:     typ,
			Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
				{Name: "udp", Port: 81, TargetPort: intstr.FromInt32(8081), Protocol: corev1.ProtocolUDP},
			},
		},
	}
}

// WaitDeploymentAvailable waits until every replica of a Deployment is
// updated and available.
func (c *Cluster) WaitDeploymentAvailable(ctx context.Context, namespace, name string, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		d, err := c.Client.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil // keep the last status seen for the message
		}
		want := ptr.Deref(d.Spec.Replicas, 1)
		last = fmt.Sprintf("%d of %d replicas available, %d updated, observed generation %d of %d", d.Status.AvailableReplicas, want, d.Status.UpdatedReplicas, d.Status.ObservedGeneration, d.Generation)
		return d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == want &&
			d.Status.AvailableReplicas == want && d.Status.Replicas == want, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for deployment %s/%s (%s; %s): %w", namespace, name, last, c.diagnose(namespace, name), err)
	}
	return nil
}

// diagnose describes a Deployment's pods and the nodes, for a timeout's
// error message.
func (c *Cluster) diagnose(namespace, app string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var b strings.Builder
	pods, err := c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err == nil {
		for _, p := range pods.Items {
			fmt.Fprintf(&b, "pod %s on %q %s", p.Name, p.Spec.NodeName, p.Status.Phase)
			for _, cond := range p.Status.Conditions {
				if cond.Status != corev1.ConditionTrue {
					fmt.Fprintf(&b, " (%s=%s %s)", cond.Type, cond.Status, cond.Message)
				}
			}
			b.WriteString("; ")
		}
	}
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, n := range nodes.Items {
			ready := "unknown"
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					ready = string(cond.Status)
				}
			}
			fmt.Fprintf(&b, "node %s Ready=%s unschedulable=%v taints=%v; ", n.Name, ready, n.Spec.Unschedulable, n.Spec.Taints)
		}
	}
	return b.String()
}

// WaitServiceEndpoints waits until a Service's EndpointSlices list want
// ready endpoints: only then does traffic through it reach every pod.
func (c *Cluster) WaitServiceEndpoints(ctx context.Context, namespace, name string, want int, timeout time.Duration) error {
	got := 0
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		slices, err := c.Client.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
		if err != nil {
			return false, nil
		}
		ready := map[string]bool{}
		for _, s := range slices.Items {
			for _, ep := range s.Endpoints {
				if ptr.Deref(ep.Conditions.Ready, true) && len(ep.Addresses) > 0 {
					ready[ep.Addresses[0]] = true
				}
			}
		}
		got = len(ready)
		return got == want, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for service %s/%s to have %d ready endpoints (has %d): %w", namespace, name, want, got, err)
	}
	return nil
}

// WaitNodePorts waits until every node accepts connections on each TCP
// node port of the Service: every node's kube-proxy has programmed it.
// Endpoints show in the API before that, as in any cluster.
func (c *Cluster) WaitNodePorts(ctx context.Context, namespace, name string, timeout time.Duration) error {
	svc, err := c.Client.CoreV1().Services(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading service %s/%s: %w", namespace, name, err)
	}
	var missing string
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		for _, p := range svc.Spec.Ports {
			if p.NodePort == 0 || (p.Protocol != corev1.ProtocolTCP && p.Protocol != "") {
				continue
			}
			for _, n := range c.Nodes {
				addr := net.JoinHostPort(n.IP, fmt.Sprint(p.NodePort))
				conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", addr)
				if err != nil {
					missing = fmt.Sprintf("%s (%s): %v", addr, n.Name, err)
					return false, nil
				}
				_ = conn.Close()
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for every node to serve the node ports of %s/%s (%s): %w", namespace, name, missing, err)
	}
	return nil
}

// AgnhostDeployment is EchoDeployment's app on real nodes
// (Options.RealKubelets): agnhost netexec, Kubernetes' own test server, with
// HTTP on port 8080 (/hostname, /echo, /clientip, ...) and UDP on 8081, ready
// once /readyz answers. Its image is built from source and imported into
// every real node (nodeimage.AgnhostRef).
func AgnhostDeployment(namespace, name string, replicas int32) *appsv1.Deployment {
	d := EchoDeployment(namespace, name, replicas)
	c := &d.Spec.Template.Spec.Containers[0]
	c.Image = nodeimage.AgnhostRef
	c.ImagePullPolicy = corev1.PullNever
	c.Args = []string{"netexec", "--http-port=8080", "--udp-port=8081"}
	c.ReadinessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("http")}},
		PeriodSeconds: 1,
	}
	return d
}

// AppDeployment is the test app for the cluster's kind of nodes:
// AgnhostDeployment on real nodes, EchoDeployment on simulated ones. Both
// answer HTTP on port 8080 (200 to GET /) and UDP on 8081.
func (c *Cluster) AppDeployment(namespace, name string, replicas int32) *appsv1.Deployment {
	if c.RealKubelets() {
		return AgnhostDeployment(namespace, name, replicas)
	}
	return EchoDeployment(namespace, name, replicas)
}

// appDelayShutdown is how long the real app goes on serving after SIGTERM
// (netexec's --delay-shutdown; it then exits at once, ending the
// connections it still has).
//
// Measured on real kubelets (bench-drain, 3 runs, 2026-11-26): 0 failed
// requests, and 0, 12 and 3 of about 540 long-lived connections ended by
// the app's exit ("unexpected EOF"): most likely connections a
// kube-proxy opened to the pod before it learned the pod was leaving.
// With 4 s here and a 10 s grace period, ebb's drain once failed 2,419 and
// 3,345 requests in two runs (timeouts awaiting headers, during the drain,
// before the node went down); not explained, so the app's longer window
// comes from preStop (appPreStop) instead.
const appDelayShutdown = 2

// appPreStop is the real app's preStop sleep: how long it goes on
// accepting after its pod is deleted, before SIGTERM. It must outlast the
// time every kube-proxy takes to learn that the endpoint is terminating
// (the EndpointSlice controller's update, then each proxy's sync), which a
// load balancer in front of node ports cannot shorten. Measured on this
// 2-core machine during the demo (2026-11-27, kube-proxy's
// kubeproxy_network_programming_duration_seconds, 3 nodes): 18 of 23
// changes programmed within 2 s, 21 within 4 s, the mean 2.0 s. With
// 2 s here (4 s of serving with appDelayShutdown), 2 of 3 demos failed 79
// and 182 requests, all sent 3 to 5 s after an eviction and timing out on
// the pod that had just exited. 5 s gives 7 s of serving, in a grace
// period of 10 s.
const appPreStop, appGracePeriod = 5, 10

// simulatedPreStop is the echo app's preStop sleep on simulated nodes,
// the demo's value there since before real nodes (its kube-proxies are
// real too, with the same 1 s minSyncPeriod; no run measured a failure
// with it there).
const simulatedPreStop = 2

// GracefulAppDeployment is AppDeployment as an application behind
// kube-proxy must be for its pods' eviction to fail no request (the demo's
// app, and the benchmarks' that evict pods): a preStop sleep keeps it
// accepting while every node's kube-proxy learns that the endpoint is
// leaving, and on real nodes it goes on serving its open connections for
// a moment after SIGTERM.
func (c *Cluster) GracefulAppDeployment(namespace, name string, replicas int32) *appsv1.Deployment {
	d := c.AppDeployment(namespace, name, replicas)
	ctr := &d.Spec.Template.Spec.Containers[0]
	if !c.RealKubelets() {
		ctr.Lifecycle = preStopSleep(simulatedPreStop)
		return d
	}
	d.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](appGracePeriod)
	ctr.Args = append(ctr.Args, fmt.Sprintf("--delay-shutdown=%d", appDelayShutdown))
	ctr.Lifecycle = preStopSleep(appPreStop)
	return d
}

// preStopSleep keeps a pod accepting for seconds after its deletion, as
// applications behind kube-proxy must to ride out the moment every proxy
// needs to learn that an endpoint left (any rolling update needs it).
func preStopSleep(seconds int64) *corev1.Lifecycle {
	return &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: seconds}}}
}
