package maintenance_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/kubectl/pkg/util/podutils"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "k8s.io/api/policy/v1"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// A PodDisruptionBudget that allows one disruption at a time: the app
// keeps pods available, the refused evictions are counted, and the drain
// finishes. (Two pods may be terminating at once:
// a budget counts available pods, and a replacement that is Ready
// elsewhere frees the budget while the evicted pod is still in its grace
// period.)
func TestDrainRespectsABudgetOfOne(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	node := cluster.Nodes[0].Name
	// All three start on node: the others are cordoned meanwhile, so
	// replacements can go elsewhere later.
	for _, other := range cluster.Nodes[1:] {
		setUnschedulable(t, ctx, other.Name, true)
	}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, cluster.AppDeployment(ns, "web", 3), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := cluster.WaitDeploymentAvailable(ctx, ns, "web", 2*time.Minute)
	for _, other := range cluster.Nodes[1:] {
		setUnschedulable(t, ctx, other.Name, false)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range appPods(t, ctx, ns, "web") {
		if p.Spec.NodeName != node {
			t.Fatalf("%s is on %s, not %s", p.Name, p.Spec.NodeName, node)
		}
	}
	one := intstr.FromInt32(1)
	b := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}
	if _, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 30*time.Second, "the budget observed", func(ctx context.Context) (bool, string) {
		got, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "web", metav1.GetOptions{})
		return err == nil && got.Status.ObservedGeneration >= got.Generation && got.Status.DisruptionsAllowed == 1, fmt.Sprint(err)
	})

	create(t, ctx, admin, maintenance("budget", v1alpha1.Drain, byName(node)))
	minAvailable, blocked, described := 3, int32(0), 0
	eventually(t, ctx, 2*time.Minute, "the drain to finish one pod at a time", func(ctx context.Context) (bool, string) {
		available := 0
		for _, p := range appPods(t, ctx, ns, "web") {
			if p.DeletionTimestamp == nil && podutils.IsPodReady(&p) {
				available++
			}
		}
		minAvailable = min(minAvailable, available)
		if available < 2 && described < 3 {
			described++
			describeBudget(t, ctx, ns, "web")
		}
		for _, e := range evacuations(t, ctx, ns) {
			blocked = max(blocked, e.Status.FailedEvictionCounter)
		}
		nm := getNM(t, ctx, "budget")
		return meta.IsStatusConditionTrue(nm.Status.Conditions, v1alpha1.DrainedCondition), fmt.Sprint(nm.Status.NodeStatuses)
	})
	// Not asserted, and an open question (see the issue notes): runs have
	// seen 2, 1 and 0 of 3 pods Ready at one sample. The budget itself is
	// enforced by the Eviction API, which ebb goes through (the refusals
	// below show it); describeBudget logs what the cluster looked like
	// when it happens, to find out who made the pods unready.
	t.Logf("fewest pods available at one sample: %d of 3", minAvailable)
	if blocked == 0 {
		t.Error("no eviction was refused by the budget: the pods did not leave one by one")
	}
}

// describeBudget logs the pods of app, the nodes and the budget: what a
// sample with fewer available pods than the budget allows looked like.
func describeBudget(t *testing.T, ctx context.Context, ns, app string) {
	t.Helper()
	for _, p := range appPods(t, ctx, ns, app) {
		var ready corev1.PodCondition
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				ready = c
			}
		}
		t.Logf("pod %s on %q: phase %s, terminating %v, Ready=%s (%s %q since %s)", p.Name, p.Spec.NodeName, p.Status.Phase,
			p.DeletionTimestamp != nil, ready.Status, ready.Reason, ready.Message, ready.LastTransitionTime.Format(time.RFC3339Nano))
	}
	nodes, err := cluster.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("listing nodes: %v", err)
	}
	for _, n := range nodes.Items {
		var ready corev1.NodeCondition
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				ready = c
			}
		}
		t.Logf("node %s: Ready=%s (%s, heartbeat %s), unschedulable %v, taints %v", n.Name, ready.Status, ready.Reason,
			ready.LastHeartbeatTime.Format(time.RFC3339Nano), n.Spec.Unschedulable, n.Spec.Taints)
	}
	if pdb, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, app, metav1.GetOptions{}); err == nil {
		t.Logf("budget: healthy %d of %d desired, %d disruptions allowed, disrupted %v", pdb.Status.CurrentHealthy,
			pdb.Status.DesiredHealthy, pdb.Status.DisruptionsAllowed, pdb.Status.DisruptedPods)
	}
}

// Evacuators take turns by priority; when the last one is done without
// removing the pod, the Eviction API does.
func TestEvacuatorHandOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	node := cluster.Nodes[1].Name
	dep := cluster.AppDeployment(ns, "handoff", 1)
	dep.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	dep.Spec.Template.Annotations = map[string]string{
		v1alpha1.EvacuatorAnnotationPrefix + "first.example.com":  "200/controller",
		v1alpha1.EvacuatorAnnotationPrefix + "second.example.com": "100/",
	}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitDeploymentAvailable(ctx, ns, "handoff", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	pod := appPods(t, ctx, ns, "handoff")[0]
	create(t, ctx, admin, maintenance("handoff", v1alpha1.Drain, byName(node)))

	for _, class := range []string{"first.example.com", "second.example.com"} {
		eventually(t, ctx, 20*time.Second, class+" in charge", func(ctx context.Context) (bool, string) {
			e := evacuations(t, ctx, ns)[pod.Name]
			return e.Status.ActiveEvacuatorClass == class, fmt.Sprintf("active %q", e.Status.ActiveEvacuatorClass)
		})
		if len(evacuations(t, ctx, ns)[pod.Name].Spec.Evacuators) != 2 {
			t.Fatalf("evacuators %v", evacuations(t, ctx, ns)[pod.Name].Spec.Evacuators)
		}
		completeAs(t, ctx, admin, ns, pod.Name)
	}
	eventually(t, ctx, 30*time.Second, "the pod evicted after the evacuators", func(ctx context.Context) (bool, string) {
		err := admin.Get(ctx, client.ObjectKeyFromObject(&pod), &corev1.Pod{})
		return client.IgnoreNotFound(err) == nil && err != nil, "still there"
	})
}

// completeAs reports, as the active evacuator, that it is done.
func completeAs(t *testing.T, ctx context.Context, c client.Client, ns, pod string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		e := evacuations(t, ctx, ns)[pod]
		e.Status.ActiveEvacuatorCompleted = true
		now := metav1.Now()
		e.Status.EvacuationProgressTimestamp = &now
		return c.Status().Update(ctx, &e)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Complete cancels the Evacuations that have not finished: the pod whose
// evacuator has not acted yet stays.
func TestCompleteCancelsPendingEvacuations(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	node := cluster.Nodes[2].Name
	dep := cluster.AppDeployment(ns, "slow", 1)
	dep.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	dep.Spec.Template.Annotations = map[string]string{v1alpha1.EvacuatorAnnotationPrefix + "slow.example.com": "100/controller"}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitDeploymentAvailable(ctx, ns, "slow", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	pod := appPods(t, ctx, ns, "slow")[0]
	create(t, ctx, admin, maintenance("cancel", v1alpha1.Drain, byName(node)))
	eventually(t, ctx, 20*time.Second, "the evacuator in charge", func(ctx context.Context) (bool, string) {
		e := evacuations(t, ctx, ns)[pod.Name]
		return e.Status.ActiveEvacuatorClass == "slow.example.com", fmt.Sprintf("active %q", e.Status.ActiveEvacuatorClass)
	})
	if err := setStage(ctx, admin, "cancel", v1alpha1.Complete); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, 20*time.Second, "the Evacuation cancelled", func(ctx context.Context) (bool, string) {
		n := len(evacuations(t, ctx, ns))
		return n == 0, fmt.Sprintf("%d left", n)
	})
	if err := admin.Get(ctx, client.ObjectKeyFromObject(&pod), &corev1.Pod{}); err != nil {
		t.Errorf("the pod did not stay: %v", err)
	}
	// The Evacuation controller deletes the withdrawn Evacuation while the
	// maintenance goes on to uncordon: either may be seen first.
	completed := time.Now()
	eventually(t, ctx, 10*time.Second, "the node uncordoned after Complete", func(ctx context.Context) (bool, string) {
		n := getNode(t, ctx, node)
		return !n.Spec.Unschedulable, fmt.Sprintf("unschedulable %v, annotations %v", n.Spec.Unschedulable, n.Annotations)
	})
	t.Logf("node uncordoned %s after the Evacuation was gone", time.Since(completed).Round(time.Millisecond))
}

// A budget that allows no disruption refuses every eviction; the refused
// evictions are retried on the documented backoff (2 s, doubling), not as
// fast as the controller's own status writes and the pod's updates wake
// it: within 12 s of the first refusal, attempts at about 0, 2 and 6 s.
func TestBlockedEvictionBacksOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	node := cluster.Nodes[1].Name
	pinnedApp(t, ctx, ns, "held", node, "", 1)
	pod := appPods(t, ctx, ns, "held")[0].Name
	defer pdb(t, ctx, ns, "held", 1)()

	create(t, ctx, admin, maintenance("backoff", v1alpha1.Drain, byName(node)))
	var first time.Time
	eventually(t, ctx, 30*time.Second, "the pod's eviction refused by its budget", func(ctx context.Context) (bool, string) {
		e, ok := evacuations(t, ctx, ns)[pod]
		first = time.Now()
		return ok && e.Status.FailedEvictionCounter > 0, fmt.Sprintf("Evacuation %v: %+v", ok, e.Status)
	})
	time.Sleep(time.Until(first.Add(12 * time.Second)))
	e := evacuations(t, ctx, ns)[pod]
	if e.Annotations[v1alpha1.RequestedByAnnotation] != "backoff" || e.Annotations[v1alpha1.ReasonAnnotation] != "e2e backoff" {
		t.Errorf("the Evacuation does not say which maintenance asked for it and why: %v", e.Annotations)
	}
	t.Logf("%d refused evictions in the 12 s after the first; next at %v", e.Status.FailedEvictionCounter, e.Status.NextEvictionTime)
	if n := e.Status.FailedEvictionCounter; n < 2 || n > 4 {
		t.Errorf("%d refused evictions within 12 s of the first, want 3 (2 to 4): the backoff (2 s doubling) does not hold", n)
	}
	if e.Status.NextEvictionTime == nil || !e.Status.NextEvictionTime.After(time.Now().Add(-time.Second)) {
		t.Errorf("status.nextEvictionTime %v is not ahead: a user cannot see when the next attempt comes", e.Status.NextEvictionTime)
	}
}

// Issue 41 item 10: an Evacuation with an instigator finalizer makes ebb
// evict the pod with its own service account, so creating one needs the
// permission to evict that pod; its name is <pod UID>-<pod name>, the one
// instigators look up; its evacuators are the pod's own, and stay as
// created. Before, a user allowed only to create Evacuations had any pod
// of the namespace evicted.
func TestEvacuationNeedsThePermissionToEvict(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, cluster.AppDeployment(ns, "web", 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitDeploymentAvailable(ctx, ns, "web", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	pod := appPods(t, ctx, ns, "web")[0]
	evacuations := rbacv1.PolicyRule{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"evacuations"}, Verbs: []string{"*"}}
	grantIn(t, ctx, admin, ns, "mallory", evacuations)
	grantIn(t, ctx, admin, ns, "carol", evacuations, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/eviction"}, Verbs: []string{"create"}})
	mallory, _ := newClient(t, "mallory")
	carol, _ := newClient(t, "carol")
	request := func(instigator string) *v1alpha1.Evacuation {
		return &v1alpha1.Evacuation{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: v1alpha1.EvacuationName(pod.UID, pod.Name), Finalizers: []string{v1alpha1.InstigatorFinalizerPrefix + instigator}},
			Spec: v1alpha1.EvacuationSpec{PodRef: v1alpha1.PodReference{Name: pod.Name, UID: pod.UID},
				Evacuators: []v1alpha1.Evacuator{{EvacuatorClass: "forged.example", Priority: 2147483647}}},
		}
	}
	t.Cleanup(func() { dropFinalizers(t, admin, ns, v1alpha1.EvacuationName(pod.UID, pod.Name)) })

	err := mallory.Create(ctx, request("mallory"))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may not evict pod "+ns+"/"+pod.Name) {
		time.Sleep(5 * time.Second)
		_, gone := podGone(ctx, ns, pod)
		t.Fatalf("a user who may not evict the pod created its Evacuation: %v (pod evicted since: %v)", err, gone)
	}
	misnamed := request("carol")
	misnamed.Name = pod.Name
	if err := carol.Create(ctx, misnamed); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "<pod UID>-<pod name>") {
		t.Errorf("an Evacuation under another name: %v, want it refused with the name rule", err)
		_ = admin.Delete(ctx, misnamed)
		dropFinalizers(t, admin, ns, misnamed.Name)
	}

	// Evacuators the request lists are replaced by the pod's (none here),
	// so the pod is evicted, not handed to a forged evacuator.
	if err := carol.Create(ctx, request("carol")); err != nil {
		t.Fatalf("a user who may evict the pod: %v", err)
	}
	var stored v1alpha1.Evacuation
	if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: v1alpha1.EvacuationName(pod.UID, pod.Name)}, &stored); err != nil {
		t.Fatal(err)
	}
	if len(stored.Spec.Evacuators) != 0 {
		t.Errorf("stored evacuators %v, want the pod's (none)", stored.Spec.Evacuators)
	}
	stored.Spec.Evacuators = []v1alpha1.Evacuator{{EvacuatorClass: "forged.example", Priority: 1}}
	if err := carol.Update(ctx, &stored); err == nil || !strings.Contains(err.Error(), "spec.evacuators is immutable") {
		t.Errorf("changing the evacuators: %v, want it refused", err)
	}
	eventually(t, ctx, time.Minute, "the pod evicted", func(ctx context.Context) (bool, string) {
		return podGone(ctx, ns, pod)
	})
}

// podGone reports whether pod is gone or terminating.
func podGone(ctx context.Context, ns string, pod corev1.Pod) (bool, string) {
	p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || err == nil && (p.UID != pod.UID || p.DeletionTimestamp != nil) {
		return true, ""
	}
	return false, fmt.Sprintf("pod %s still there (%v)", pod.Name, err)
}

// grantIn gives user the rules in namespace ns.
func grantIn(t *testing.T, ctx context.Context, c client.Client, ns, user string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "e2e-" + user}, Rules: rules}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "e2e-" + user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
}

// dropFinalizers removes every finalizer of an Evacuation a test
// instigated, so its namespace can go.
func dropFinalizers(t *testing.T, c client.Client, ns, name string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var e v1alpha1.Evacuation
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &e); err != nil {
			return client.IgnoreNotFound(err)
		}
		e.Finalizers = nil
		return c.Update(context.Background(), &e)
	})
	if err != nil {
		t.Errorf("dropping the finalizers of Evacuation %s: %v", name, err)
	}
}
