// Package e2eutil holds the helpers the end-to-end test packages share.
package e2eutil

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/ebbdev/ebb/internal/localcluster"
)

// NewNamespace creates a namespace for one test, waits for its default
// service account (ServiceAccount admission is on, and the controller
// manager creates it), and deletes the namespace after the test.
func NewNamespace(t *testing.T, ctx context.Context, c *localcluster.Cluster) string {
	t.Helper()
	ns, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a namespace: %v", err)
	}
	t.Cleanup(func() {
		// Deleted, and its Services waited for: their addresses are
		// released, and ebb lb withdraws them soon after, so that the next
		// test of the suite counts (mostly) owners, takeovers and
		// addresses of its own, however long the pods take to end (real
		// kubelets run their preStop hooks and grace periods). A cluster
		// that cannot delete them costs a minute per test, logged.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// The Services first, by name (Services have no deletecollection):
		// the namespace controller reaches them only after its discovery
		// and requeue delays, 10 s a test in the service suite.
		if svcs, err := c.Client.CoreV1().Services(ns.Name).List(ctx, metav1.ListOptions{}); err == nil {
			for _, svc := range svcs.Items {
				_ = c.Client.CoreV1().Services(ns.Name).Delete(ctx, svc.Name, metav1.DeleteOptions{})
			}
		}
		_ = c.Client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{})
		err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			svcs, err := c.Client.CoreV1().Services(ns.Name).List(ctx, metav1.ListOptions{})
			return err == nil && len(svcs.Items) == 0, nil
		})
		if err != nil {
			t.Logf("the Services of namespace %s were not gone a minute after its deletion", ns.Name)
		}
	})
	Eventually(t, ctx, 30*time.Second, "the default service account of "+ns.Name, func(ctx context.Context) (bool, string) {
		_, err := c.Client.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	return ns.Name
}

// Eventually polls cond until it holds or timeout passes, then fails the
// test with the last reason cond gave.
func Eventually(t *testing.T, ctx context.Context, timeout time.Duration, what string, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, reason := cond(ctx)
		if ctx.Err() == nil || last == "" {
			// A poll cut short by the deadline says only that; keep
			// what the one before saw.
			last = reason
		}
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s: not within %s: %s", what, timeout, last)
	}
}

// ExpectUDPEcho waits until a datagram sent to addr from this process
// comes back unchanged.
func ExpectUDPEcho(t *testing.T, ctx context.Context, addr string) {
	t.Helper()
	var d net.Dialer
	ExpectUDPEchoVia(t, ctx, d.DialContext, addr)
}

// ExpectUDPEchoVia waits until a datagram sent to addr through dial (a
// host's DialContext: from that host) comes back unchanged.
func ExpectUDPEchoVia(t *testing.T, ctx context.Context, dial func(ctx context.Context, network, address string) (net.Conn, error), addr string) {
	t.Helper()
	conn, err := dial(ctx, "udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buf := make([]byte, 64)
	Eventually(t, ctx, 20*time.Second, "a UDP echo from "+addr, func(context.Context) (bool, string) {
		// The echo servers send the datagram back; agnhost netexec answers
		// its command "echo <msg>" with <msg>.
		if _, err := conn.Write([]byte("echo ping")); err != nil {
			return false, err.Error()
		}
		_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := conn.Read(buf)
		if err != nil {
			return false, err.Error()
		}
		got := strings.TrimSpace(string(buf[:n]))
		return got == "ping" || got == "echo ping", fmt.Sprintf("answer %q", buf[:n])
	})
}
