package service_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/ebbdev/ebb/internal/controller/adminstate"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// A stale Node that gives another node's InternalIP (a machine reinstalled
// under a new name while its old Node lingers) costs its own backend only:
// a Service served before goes on answering, one created after is served
// too, and the stale Node carries a Warning that names both nodes. Before,
// the two backends with one address made every node-mode frontend invalid,
// so no Service of ebb's class could be served on any LB host.
func TestAStaleNodeWithAnotherNodesAddressCostsOnlyItself(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	before := fmt.Sprintf("http://%s:80/", exposeApp(t, ctx, ns, "before", 2))
	waitServes(t, ctx, before)

	machine := appNodes()[0]
	stale := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "stale-" + machine.Name}}
	stale, err := cluster.Client.CoreV1().Nodes().Create(ctx, stale, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), stale.Name, metav1.DeleteOptions{})
	})
	// The node lifecycle controller taints a Node no kubelet updates:
	// retry on its writes.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, stale.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: machine.IP}}
		_, err = cluster.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatalf("giving the stale Node %s's address: %v", machine.Name, err)
	}
	// ebb lb has seen the stale Node once its backend is gone, or was
	// never there: its LoadBalancerReport's sync follows the Node's.
	time.Sleep(2 * time.Second)

	load := e2eutil.StartRequests(t, ctx, httpClient, before, 2)
	after := fmt.Sprintf("http://%s:80/", exposeApp(t, ctx, ns, "after", 2))
	waitServes(t, ctx, after)
	time.Sleep(2 * time.Second)
	load.Halt()
	if errs := load.Errors(); len(errs) > 0 {
		t.Errorf("%d of %d requests to the Service served before failed; first: %v", len(errs), int(load.OK.Load())+len(errs), errs[0])
	}
	t.Logf("%d requests to the Service served before, 0 failed; the Service created after answers", load.OK.Load())
	eventually(t, ctx, 20*time.Second, "a Warning on the stale Node naming both", func(ctx context.Context) (bool, string) {
		n := nodeEvents(t, ctx, stale.Name, adminstate.ReasonDuplicateAddress)
		return n > 0, fmt.Sprintf("%d events", n)
	})
}
