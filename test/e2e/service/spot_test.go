package service_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ebbdev/ebb/internal/controller/spot"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
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
	if err := cluster.EmitPreemptScheduled(ctx, name); err != nil {
		t.Fatal(err)
	}
	defer setTaint(t, context.Background(), name, false)
	eventually(t, ctx, 20*time.Second, "the spot-eviction taint", func(context.Context) (bool, string) {
		v := spotTaintOn(t, ctx, name)
		return v == "spot-eviction:NoSchedule", fmt.Sprintf("taint %q", v)
	})
	eventually(t, ctx, 10*time.Second, "the node's backends to turn admin Down", func(context.Context) (bool, string) {
		return adminDown(t, name), "not Down yet"
	})

	// The operator clears the taint: the Event, already acted on, does not
	// put it back.
	setTaint(t, ctx, name, false)
	time.Sleep(time.Second)
	if v := spotTaintOn(t, ctx, name); v != "" {
		t.Errorf("the handled Event tainted the node again: %q", v)
	}
}

// A namespace editor (the built-in edit role, which may write Events)
// forges the PreemptScheduled Event for a node, the way the API server
// lets them: in their own namespace, naming the Node with that namespace.
// ebb does not mark the node leaving, counts the refusal, and says on the
// node why; the real emitter's Event about the same node still does.
func TestForgedPreemptionEventFromANamespaceEditorMovesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	exposeApp(t, ctx, ns, "forged", 3)
	name := cluster.Nodes[0].Name
	const editor = "tenant-editor"
	if _, err := cluster.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "editor"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: editor}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: editor, Groups: []string{"system:authenticated"}}
	tenant, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	refusedBefore := e2eutil.Sum(e2eutil.GrepLines(e2eutil.ControllerMetrics(t, ctx, cluster), `result="refused-namespace"`), "ebb_spot_preemption_events_total")
	now := metav1.Now()
	forged := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: ns, GenerateName: "preempt-"},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: name, Namespace: ns, APIVersion: "v1"}, // no UID: the editor cannot read Nodes
		Reason:         lbmodel.ReasonPreemptScheduled, Message: "Preempt Scheduled", Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: localcluster.PreemptionSource, Host: name},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	t.Cleanup(func() { setTaint(t, context.Background(), name, false) })
	if _, err := tenant.CoreV1().Events(ns).Create(ctx, forged, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the namespace editor could not write the Event (the attack needs it): %v", err)
	}
	// What a user would notice first: the node tainted and its backends
	// Down within a second (the real emitter's Event below takes well
	// under that). Nothing may happen for 5 s.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if v := spotTaintOn(t, ctx, name); v != "" {
			t.Fatalf("a namespace editor's forged Event tainted node %s: %q", name, v)
		}
	}
	if adminDown(t, name) {
		t.Fatalf("a namespace editor's forged Event set node %s admin Down", name)
	}
	eventually(t, ctx, 20*time.Second, "the refusal counted and said on the node", func(ctx context.Context) (bool, string) {
		refused := e2eutil.Sum(e2eutil.GrepLines(e2eutil.ControllerMetrics(t, ctx, cluster), `result="refused-namespace"`), "ebb_spot_preemption_events_total")
		said := nodeEvents(t, ctx, name, spot.ReasonSpotSignalRefused)
		return refused > refusedBefore && said > 0, fmt.Sprintf("refused %v (before %v), %d events", refused, refusedBefore, said)
	})

	// The real emitter's Event about the same node is acted on.
	if err := cluster.EmitPreemptScheduled(ctx, name); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 20*time.Second, "the spot-eviction taint from node-problem-detector's Event", func(context.Context) (bool, string) {
		v := spotTaintOn(t, ctx, name)
		return v == "spot-eviction:NoSchedule", fmt.Sprintf("taint %q", v)
	})
}

// spotTaintOn is the value and effect of the node's ebb.dev/draining
// taint, or "".
func spotTaintOn(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	n, err := cluster.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range n.Spec.Taints {
		if tn.Key == lbmodel.TaintDraining {
			return tn.Value + ":" + string(tn.Effect)
		}
	}
	return ""
}
