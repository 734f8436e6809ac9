package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// A Deployment of 3 replicas behind a NodePort Service: every node's
// IP:nodePort answers, and the answers come from all three pods.
func TestNodePortReachesEveryPodThroughEveryNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	svc := deployEcho(t, ctx, ns, 3, corev1.ServiceTypeNodePort)
	if err := cluster.WaitServiceEndpoints(ctx, ns, "web", 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, p := range pods.Items {
		want[p.Name] = true
	}
	if len(want) != 3 {
		t.Fatalf("want 3 pods, have %d", len(want))
	}

	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	nodePort := svc.Spec.Ports[0].NodePort
	for _, node := range cluster.Nodes {
		url := fmt.Sprintf("http://%s:%d/", node.IP, nodePort)
		// kube-proxy opens the port when it sees the Service and its
		// endpoints; wait for the first answer, then every request counts.
		eventually(t, ctx, 30*time.Second, "first answer from "+url, func(ctx context.Context) (bool, string) {
			_, err := getIdentity(ctx, client, url)
			return err == nil, fmt.Sprint(err)
		})
		// Endpoints are in the API before every kube-proxy has programmed
		// them (as in any cluster): each node must reach all three pods
		// within a bound, and no request may fail meanwhile.
		seen := map[string]bool{}
		eventually(t, ctx, 30*time.Second, url+" reaching all three pods", func(ctx context.Context) (bool, string) {
			for i := 0; i < 60 && len(seen) < len(want); i++ {
				id, err := getIdentity(ctx, client, url)
				if err != nil {
					t.Fatalf("request %d to %s failed: %v", i, url, err)
				}
				if !want[id.Pod] {
					t.Fatalf("%s answered from unknown pod %q", url, id.Pod)
				}
				seen[id.Pod] = true
			}
			return len(seen) == len(want), fmt.Sprintf("reached %v", seen)
		})
	}

	// UDP through a node port reaches a pod's UDP echo.
	e2eutil.ExpectUDPEcho(t, ctx, net.JoinHostPort(cluster.Nodes[0].IP, fmt.Sprint(svc.Spec.Ports[1].NodePort)))
}

// With externalTrafficPolicy Local, a node without a local endpoint refuses
// the node port and its healthCheckNodePort answers 503, while the node with
// the endpoint serves and answers 200 with localEndpoints 1.
func TestExternalTrafficPolicyLocal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	withPod, withoutPod := cluster.Nodes[0], cluster.Nodes[1]
	dep := cluster.AppDeployment(ns, "local", 1)
	dep.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: withPod.Name}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := localcluster.EchoService(ns, "local", corev1.ServiceTypeLoadBalancer)
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(true)
	svc, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.HealthCheckNodePort == 0 {
		t.Fatal("the apiserver allocated no healthCheckNodePort for a Local LoadBalancer Service")
	}
	if err := cluster.WaitDeploymentAvailable(ctx, ns, "local", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	nodePort, hcPort := svc.Spec.Ports[0].NodePort, svc.Spec.HealthCheckNodePort

	health := func(node localcluster.Node) (int, int, error) {
		resp, err := client.Get(fmt.Sprintf("http://%s:%d/healthz", node.IP, hcPort))
		if err != nil {
			return 0, 0, err
		}
		defer resp.Body.Close()
		var body struct {
			LocalEndpoints int `json:"localEndpoints"`
		}
		data, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(data, &body); err != nil {
			return resp.StatusCode, 0, fmt.Errorf("decoding %q: %w", data, err)
		}
		return resp.StatusCode, body.LocalEndpoints, nil
	}
	eventually(t, ctx, 30*time.Second, "health check of the node with the pod", func(context.Context) (bool, string) {
		code, n, err := health(withPod)
		return err == nil && code == http.StatusOK && n == 1, fmt.Sprintf("status %d, localEndpoints %d, err %v", code, n, err)
	})
	code, n, err := health(withoutPod)
	if err != nil || code != http.StatusServiceUnavailable || n != 0 {
		t.Errorf("health check of the node without the pod: status %d, localEndpoints %d, err %v; want 503 and 0", code, n, err)
	}

	id, err := getIdentity(ctx, client, fmt.Sprintf("http://%s:%d/", withPod.IP, nodePort))
	if err != nil {
		t.Fatalf("node with the pod: %v", err)
	}
	if id.Node != withPod.Name {
		t.Errorf("answered by a pod on %s, want %s", id.Node, withPod.Name)
	}
	for range 5 {
		if _, err := getIdentity(ctx, client, fmt.Sprintf("http://%s:%d/", withoutPod.IP, nodePort)); err == nil {
			t.Fatalf("node %s without a local endpoint served a Local Service", withoutPod.Name)
		}
	}
}
