package service_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

// A PreemptScheduled Event about a node (as a cloud emits it before a spot
// eviction) taints the node ebb.dev/draining=spot-eviction once, and the
// load balancer sets the node's backends Down; with the taint cleared, the
// same Event does not taint it again.
func TestSpotPreemptionEventDrainsTheNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	exposeApp(t, ctx, ns, "spot", 3)
	name := cluster.Nodes[1].Name
	if err := cluster.EmitPreemptScheduled(ctx, name, "cloud"); err != nil {
		t.Fatal(err)
	}
	defer setTaint(t, context.Background(), name, false)
	taintValue := func() string {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return ""
		}
		for _, tn := range n.Spec.Taints {
			if tn.Key == lbmodel.TaintDraining {
				return tn.Value + ":" + string(tn.Effect)
			}
		}
		return ""
	}
	eventually(t, ctx, 20*time.Second, "the spot-eviction taint", func(context.Context) (bool, string) {
		v := taintValue()
		return v == "spot-eviction:NoSchedule", fmt.Sprintf("taint %q", v)
	})
	eventually(t, ctx, 10*time.Second, "the node's backends to turn admin Down", func(context.Context) (bool, string) {
		return adminDown(t, name), "not Down yet"
	})

	// The operator clears the taint: the Event, already acted on, does not
	// put it back.
	setTaint(t, ctx, name, false)
	time.Sleep(time.Second)
	if v := taintValue(); v != "" {
		t.Errorf("the handled Event tainted the node again: %q", v)
	}
}
