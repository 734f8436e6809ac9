package service_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

// An address shows in a Service's status only once an LB host serves and
// announces it: a client that connects the moment `kubectl get svc` shows
// the address connects on its first SYN (issue 50 item 18). Before
// ebb waited for the LB hosts, the first SYN of such a client looped
// between the router and an LB host that did not have the address yet,
// and the connection failed or waited a second for TCP's retransmission.
// Until then, the Service's lb.ebb.dev/Served condition is False and
// names the allocated address.
func TestAddressIsServedWhenPublished(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	deployApp(t, ctx, ns, "first-try", 1)
	// One try, and less than TCP's first SYN retransmission (1 s): a lost
	// SYN fails it.
	dialer := &net.Dialer{Timeout: 900 * time.Millisecond}
	for i := range 5 {
		name := fmt.Sprintf("first-try-%d", i)
		svc := lbService(ns, name, ebbClass)
		svc.Spec.Selector = map[string]string{"app": "first-try"}
		w, err := cluster.Client.CoreV1().Services(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		published, awaited := awaitPublished(t, ctx, w)
		w.Stop()
		addr := net.JoinHostPort(published.Status.LoadBalancer.Ingress[0].IP, "80")
		conn, err := dialer.DialContext(ctx, "tcp", addr)
		if err != nil {
			t.Fatalf("%s: the first connection the moment the status showed %s failed: %v", name, addr, err)
		}
		conn.Close()
		// The backends answer once kube-proxy has programmed the new
		// node port (node mode): until then ebb lb holds the connection
		// for up to 1.5 s, then resets it, and the client retries.
		eventually(t, ctx, 10*time.Second, "an answer through "+addr, func(ctx context.Context) (bool, string) {
			if _, err := get(ctx, "http://"+addr+"/"); err != nil {
				return false, err.Error()
			}
			return true, ""
		})
		if awaited != published.Status.LoadBalancer.Ingress[0].IP {
			t.Errorf("%s: the condition named %q while awaiting, the status shows %s", name, awaited, published.Status.LoadBalancer.Ingress[0].IP)
		}
		if c := meta.FindStatusCondition(published.Status.Conditions, lbmodel.ServedCondition); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("%s: published with condition %+v, want %s True", name, c, lbmodel.ServedCondition)
		}
	}
}

// awaitPublished follows a new Service until its status shows an address,
// and returns it then, with the address its Served condition named while
// it awaited an LB host, if it did (every status write is an event of the
// watch, so the awaiting state is seen if it was written).
func awaitPublished(t *testing.T, ctx context.Context, w watch.Interface) (*corev1.Service, string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	var awaited string
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch of the Service ended")
			}
			svc, isSvc := ev.Object.(*corev1.Service)
			if !isSvc {
				continue
			}
			if len(svc.Status.LoadBalancer.Ingress) > 0 {
				return svc, awaited
			}
			if addrs := lbmodel.AwaitingAddresses(svc); len(addrs) > 0 {
				awaited = addrs[0].String()
			}
		case <-timeout:
			t.Fatal("no address in the status within 30 s")
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
}
