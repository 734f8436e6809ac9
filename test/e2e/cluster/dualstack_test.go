package cluster_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/localcluster"
)

// The cluster is dual-stack as a user's would be: pods get an address of
// each family from their node's ranges, a RequireDualStack Service gets a
// ClusterIP of each family, and the real kube-proxy carries both: a node
// port answers on a node's IPv6 address, and the IPv6 ClusterIP answers
// from a node, each from a pod's IPv6 address.
func TestDualStackServiceAnswersOnBothFamilies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, cluster.AppDeployment(ns, "web", 2), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := localcluster.EchoService(ns, "web", corev1.ServiceTypeNodePort)
	svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
	svc, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitDeploymentAvailable(ctx, ns, "web", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("a RequireDualStack Service has ClusterIPs %v, want one per family", svc.Spec.ClusterIPs)
	}
	clusterIPv6 := netip.MustParseAddr(svc.Spec.ClusterIPs[1])
	if !localcluster.ServiceCIDRv6.Contains(clusterIPv6.AsSlice()) {
		t.Errorf("the Service's second ClusterIP %s is not in %s", clusterIPv6, localcluster.ServiceCIDRv6)
	}

	pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	podIPv6 := map[string]string{}
	for _, p := range pods.Items {
		if len(p.Status.PodIPs) != 2 || !localcluster.PodCIDRv6.Contains(net.ParseIP(p.Status.PodIPs[1].IP)) {
			t.Fatalf("pod %s has podIPs %v, want an IPv4 and an IPv6 address in %s", p.Name, p.Status.PodIPs, localcluster.PodCIDRv6)
		}
		podIPv6[p.Name] = p.Status.PodIPs[1].IP
	}

	// From the control-plane host (no kube-proxy of its own) to a node's
	// IPv6 address and the node port.
	node := cluster.Nodes[0]
	plain := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	nodePortURL := fmt.Sprintf("http://%s/", net.JoinHostPort(node.IPv6, fmt.Sprint(svc.Spec.Ports[0].NodePort)))
	expectIPv6Pod(t, ctx, plain, nodePortURL, podIPv6)

	// From a node's own host, where its kube-proxy translates the IPv6
	// ClusterIP.
	onNode := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: node.Host.DialContext}}
	clusterIPURL := fmt.Sprintf("http://%s/", net.JoinHostPort(clusterIPv6.String(), "80"))
	expectIPv6Pod(t, ctx, onNode, clusterIPURL, podIPv6)
}

// expectIPv6Pod waits for url to answer, then checks that the answer came
// from one of the pods, on its IPv6 address.
func expectIPv6Pod(t *testing.T, ctx context.Context, client *http.Client, url string, podIPv6 map[string]string) {
	t.Helper()
	eventually(t, ctx, 30*time.Second, "an answer from "+url, func(ctx context.Context) (bool, string) {
		id, err := getIdentity(ctx, client, url)
		if err != nil {
			return false, err.Error()
		}
		if cluster.RealKubelets() {
			// agnhost names no address of its own: the client address it
			// saw tells the family the connection reached it by.
			if _, ok := podIPv6[id.Pod]; !ok {
				t.Fatalf("%s answered from pod %q, want one of %v", url, id.Pod, podIPv6)
			}
			seen, err := clientIP(ctx, client, url)
			if err != nil {
				return false, err.Error()
			}
			if !seen.Is6() || seen.Is4In6() {
				t.Fatalf("%s reached pod %s from %s, want over IPv6", url, id.Pod, seen)
			}
			return true, ""
		}
		if want, ok := podIPv6[id.Pod]; !ok || id.PodIP != want {
			t.Fatalf("%s answered from pod %q on %s, want one of the pods on its IPv6 address (%v)", url, id.Pod, id.PodIP, podIPv6)
		}
		return true, ""
	})
}

// clientIP asks agnhost netexec at url's host which client address it saw
// (GET /clientip answers host:port).
func clientIP(ctx context.Context, client *http.Client, url string) (netip.Addr, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(url, "/")+"/clientip", nil)
	if err != nil {
		return netip.Addr{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return netip.Addr{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return netip.Addr{}, err
	}
	ap, err := netip.ParseAddrPort(strings.TrimSpace(string(body)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("GET %s/clientip: %q: %w", url, body, err)
	}
	return ap.Addr(), nil
}
