package e2eutil

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/appclient"
	"github.com/ebbdev/ebb/internal/localcluster/podserver"
)

// Identify names the pod that answers a GET to the app at target, with its
// namespace, node and IP. The echo servers of simulated nodes say all of
// it; on real nodes the app is agnhost netexec, which answers GET
// /hostname with its pod's name, so Identify reads the rest from the API.
func Identify(ctx context.Context, c *localcluster.Cluster, client *http.Client, target string) (podserver.Identity, error) {
	if !c.RealKubelets() {
		return appclient.GetIdentity(ctx, client, target)
	}
	var id podserver.Identity
	name, err := appclient.Hostname(ctx, client, target)
	if err != nil {
		return id, err
	}
	pods, err := c.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return id, fmt.Errorf("finding pod %s, which answered at %s: %w", name, target, err)
	}
	if len(pods.Items) != 1 {
		return id, fmt.Errorf("%q answered at %s: %d pods of that name", name, target, len(pods.Items))
	}
	p := pods.Items[0]
	id = podserver.Identity{Pod: p.Name, Namespace: p.Namespace, Node: p.Spec.NodeName, PodIP: p.Status.PodIP}
	// netexec's HTTP port, the first of the app's (AgnhostDeployment).
	if len(p.Spec.Containers) > 0 && len(p.Spec.Containers[0].Ports) > 0 {
		id.Port = int(p.Spec.Containers[0].Ports[0].ContainerPort)
	}
	return id, nil
}

// Answered sends one GET to the app at target and checks the answer
// (AnsweringPod). It asks nothing of the API, for loops of requests.
func Answered(ctx context.Context, c *localcluster.Cluster, client *http.Client, target string) error {
	_, err := AnsweringPod(ctx, c, client, target)
	return err
}

// AnsweringPod sends one GET to the app at target and returns the name of
// the pod that answered (appclient.AnsweringPod on the cluster's kind of
// nodes). Unlike Identify it asks nothing of the API.
func AnsweringPod(ctx context.Context, c *localcluster.Cluster, client *http.Client, target string) (string, error) {
	return appclient.AnsweringPod(ctx, client, c.RealKubelets(), target)
}

// OpenLongLived opens a kept-alive connection to the cluster's app at addr
// through dial that sends a message every interval and checks its echo:
// a raw echo on simulated nodes, agnhost netexec's /echo on real ones.
func OpenLongLived(c *localcluster.Cluster, dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string, interval time.Duration) (*loadgen.LongLived, error) {
	return appclient.OpenLongLived(dial, c.RealKubelets(), addr, interval)
}
