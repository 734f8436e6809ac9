package e2eutil

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/podserver"
)

// Identify is GetIdentity on either kind of node. The echo servers of
// simulated nodes name themselves in JSON; on real nodes the app is
// agnhost netexec, which answers GET /hostname with its pod's name, so
// Identify asks that path of target's host and port and reads the pod
// (namespace, node, IP) from the API.
func Identify(ctx context.Context, c *localcluster.Cluster, client *http.Client, target string) (podserver.Identity, error) {
	if !c.RealKubelets() {
		return GetIdentity(ctx, client, target)
	}
	var id podserver.Identity
	name, u, err := hostname(ctx, client, target)
	if err != nil {
		return id, err
	}
	pods, err := c.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return id, fmt.Errorf("finding pod %s, which answered %s: %w", name, u, err)
	}
	if len(pods.Items) != 1 {
		return id, fmt.Errorf("%s answered %q: %d pods of that name", u, name, len(pods.Items))
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
// the pod that answered: on simulated nodes from the echo's identity
// (GetIdentity), on real ones agnhost netexec's /hostname. Unlike Identify
// it asks nothing of the API.
func AnsweringPod(ctx context.Context, c *localcluster.Cluster, client *http.Client, target string) (string, error) {
	if !c.RealKubelets() {
		id, err := GetIdentity(ctx, client, target)
		return id.Pod, err
	}
	name, u, err := hostname(ctx, client, target)
	if err == nil && name == "" {
		err = fmt.Errorf("GET %s: no pod name in the answer", u)
	}
	return name, err
}

// hostname asks agnhost netexec's /hostname at target's host and port and
// returns the pod name it answers, and the URL it asked.
func hostname(ctx context.Context, client *http.Client, target string) (string, *url.URL, error) {
	u, err := url.Parse(target)
	if err != nil {
		return "", nil, err
	}
	u.Path, u.RawQuery = "/hostname", ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", u, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", u, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return "", u, fmt.Errorf("GET %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", u, fmt.Errorf("GET %s: status %d", u, resp.StatusCode)
	}
	return strings.TrimSpace(string(body)), u, nil
}

// OpenLongLived opens a kept-alive connection to the cluster's app at addr
// through dial that sends a message every interval and checks its echo:
// a raw echo on simulated nodes, agnhost netexec's /echo on real ones.
func OpenLongLived(c *localcluster.Cluster, dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string, interval time.Duration) (*loadgen.LongLived, error) {
	if c.RealKubelets() {
		return loadgen.OpenLongLivedHTTPVia(dial, addr, interval)
	}
	return loadgen.OpenLongLivedVia(dial, addr, interval)
}
