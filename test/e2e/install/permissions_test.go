package install_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// controllerAccount is the service account dist/install.yaml runs ebb's
// controller as.
const controllerAccount = "system:serviceaccount:ebb-system:ebb-controller"

// asController is a client that acts as ebb's controller's service account
// does: what its RBAC and ebb's admission policies let through.
func asController(t *testing.T) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: controllerAccount,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:ebb-system", "system:authenticated"}}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// change is one write ebb's controller might send.
type change struct {
	name string
	// send makes the write (dry run: nothing changes either way).
	send  func(ctx context.Context) error
	allow bool
}

// ebb's controller may change, on other people's objects, only what ebb
// owns (docs/security.md, config/policy): whatever bug or stolen token
// sends the request, the API server refuses the rest. Each change is sent
// as the controller's service account, in a dry run.
func TestControllerMayChangeOnlyWhatItOwns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := cluster.Client
	ebb := asController(t)
	ns := e2eutil.NewNamespace(t, ctx, cluster)

	optedIn := cluster.AppDeployment(ns, "opted-in", 1)
	optedIn.Annotations = map[string]string{"maintenance.ebb.dev/surge-evacuation": "true"}
	other := cluster.AppDeployment(ns, "other", 1)
	for _, dep := range []*appsv1.Deployment{optedIn, other} {
		if _, err := admin.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svc, err := admin.CoreV1().Services(ns).Create(ctx, localcluster.EchoService(ns, "web", corev1.ServiceTypeClusterIP), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	e2eutil.Eventually(t, ctx, time.Minute, "a pod of the opted-in Deployment", func(ctx context.Context) (bool, string) {
		pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=opted-in"})
		if err != nil || len(pods.Items) == 0 {
			return false, fmt.Sprint(err)
		}
		pod = pods.Items[0]
		return true, ""
	})
	node, err := admin.CoreV1().Nodes().Get(ctx, otherNode(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	dry := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	patchNode := func(p string, sub ...string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			_, err := ebb.CoreV1().Nodes().Patch(ctx, node.Name, types.StrategicMergePatchType, []byte(p), dry, sub...)
			return err
		}
	}
	withTaint := func(key string) string {
		taints := append(append([]corev1.Taint(nil), node.Spec.Taints...), corev1.Taint{Key: key, Value: "maintenance", Effect: corev1.TaintEffectNoSchedule})
		b, _ := json.Marshal(map[string]any{"spec": map[string]any{"taints": taints}})
		return string(b)
	}
	patchPod := func(p string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			_, err := ebb.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.StrategicMergePatchType, []byte(p), dry)
			return err
		}
	}
	patchDeployment := func(name, p string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			_, err := ebb.AppsV1().Deployments(ns).Patch(ctx, name, types.MergePatchType, []byte(p), dry)
			return err
		}
	}
	patchService := func(p string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			_, err := ebb.CoreV1().Services(ns).Patch(ctx, svc.Name, types.MergePatchType, []byte(p), dry)
			return err
		}
	}
	changes := []change{
		{"cordon a node", patchNode(`{"spec":{"unschedulable":true}}`), true},
		{"add ebb's draining taint", patchNode(withTaint("ebb.dev/draining")), true},
		{"add ebb's annotation to a node", patchNode(`{"metadata":{"annotations":{"maintenance.ebb.dev/cordon":"ebb"}}}`), true},
		{"set a node's Drained condition", patchNode(`{"status":{"conditions":[{"type":"Drained","status":"True","reason":"Drained"}]}}`, "status"), true},
		{"label a node", patchNode(`{"metadata":{"labels":{"evil":"true"}}}`), false},
		{"add another taint to a node", patchNode(withTaint("example.com/evil")), false},
		{"annotate a node beyond ebb's keys", patchNode(`{"metadata":{"annotations":{"example.com/evil":"true"}}}`), false},
		{"hold a node's deletion by cluster-autoscaler", patchNode(`{"metadata":{"annotations":{"delay-deletion.cluster-autoscaler.kubernetes.io/ebb":"until-load-balancers-drained"}}}`), true},
		{"hold a node's deletion in another's name", patchNode(`{"metadata":{"annotations":{"delay-deletion.cluster-autoscaler.kubernetes.io/other":"true"}}}`), false},
		{"change a node's addresses", patchNode(`{"status":{"addresses":[{"type":"InternalIP","address":"192.0.2.66"}]}}`, "status"), false},
		{"set a node's Ready condition", patchNode(`{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Evil"}]}}`, "status"), false},

		{"set a pod's deletion cost", patchPod(`{"metadata":{"annotations":{"controller.kubernetes.io/pod-deletion-cost":"-2147483648"}}}`), true},
		{"register the surge evacuator on a pod", patchPod(`{"metadata":{"annotations":{"maintenance.ebb.dev/evacuator-priority_surge.maintenance.ebb.dev":"10000/controller"}}}`), true},
		{"register another evacuator on a pod", patchPod(`{"metadata":{"annotations":{"maintenance.ebb.dev/evacuator-priority_other.example.com":"20000/other"}}}`), false},
		{"change a pod's image", patchPod(fmt.Sprintf(`{"spec":{"containers":[{"name":%q,"image":"example.com/evil:1"}]}}`, pod.Spec.Containers[0].Name)), false},
		{"relabel a pod", patchPod(`{"metadata":{"labels":{"app":"evil"}}}`), false},
		{"delete a pod", func(ctx context.Context) error {
			return ebb.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}, false},

		{"surge an opted-in Deployment", patchDeployment("opted-in", `{"metadata":{"annotations":{"maintenance.ebb.dev/surge-lock":"e/surging"}},"spec":{"replicas":2}}`), true},
		{"change an opted-in Deployment's image", patchDeployment("opted-in", `{"spec":{"template":{"spec":{"containers":[{"name":"evil","image":"example.com/evil:1"}]}}}}`), false},
		{"scale a Deployment that did not opt in", patchDeployment("other", `{"spec":{"replicas":2}}`), false},
		{"update (not patch) a Deployment", func(ctx context.Context) error {
			dep, err := admin.AppsV1().Deployments(ns).Get(ctx, "opted-in", metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("reading as the administrator: %w", err)
			}
			_, err = ebb.AppsV1().Deployments(ns).Update(ctx, dep, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}, false},

		{"add the cleanup finalizer and ebb's mark to a Service", patchService(`{"metadata":{"finalizers":["service.kubernetes.io/load-balancer-cleanup"],"annotations":{"lb.ebb.dev/served-by":"ebb.dev/l4"}}}`), true},
		{"change a Service's selector", patchService(`{"spec":{"selector":{"app":"evil"}}}`), false},

		{"read another Secret in ebb-system", func(ctx context.Context) error {
			_, err := ebb.CoreV1().Secrets("ebb-system").Get(ctx, "not-ebbs", metav1.GetOptions{})
			return err
		}, false},
		{"read a webhook configuration that is not ebb's", func(ctx context.Context) error {
			_, err := ebb.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "not-ebbs", metav1.GetOptions{})
			return err
		}, false},
		{"read ebb's webhook configuration", func(ctx context.Context) error {
			_, err := ebb.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "ebb-validating-webhook-configuration", metav1.GetOptions{})
			return err
		}, true},
	}
	check(t, ctx, changes)
}

// check sends each change and says which came out otherwise than expected.
func check(t *testing.T, ctx context.Context, changes []change) {
	t.Helper()
	for _, c := range changes {
		err := c.send(ctx)
		switch {
		case c.allow && err != nil:
			t.Errorf("%s: refused, but ebb needs it: %v", c.name, err)
		case !c.allow && err == nil:
			t.Errorf("%s: allowed, and must not be", c.name)
		case !c.allow && !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err):
			t.Errorf("%s: refused for another reason than a permission or a policy: %v", c.name, err)
		case !c.allow && strings.Contains(err.Error(), "resulted in error"):
			// A policy that fails to evaluate refuses too (failurePolicy:
			// Fail), but says nothing a user can act on.
			t.Errorf("%s: refused by a policy that did not evaluate: %v", c.name, err)
		case !c.allow:
			t.Logf("%s: refused: %s", c.name, strings.Join(strings.Fields(err.Error()), " "))
		}
	}
}

// An ebb lb replica may write only its own LoadBalancerReport, naming its
// own node as its host: the API server reads both from the token the
// kubelet binds to the replica's pod. A replica's token cannot make another
// host look drained or unserved (docs/security.md).
func TestLBReplicaMayWriteOnlyItsOwnReport(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := e2eutil.APIClient(t, cluster)
	pods, err := cluster.Client.CoreV1().Pods("ebb-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=ebb-lb"})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("no ebb lb pod: %v", err)
	}
	pod := pods.Items[0]
	// The token the kubelet mounts: the service account's, bound to the pod.
	tok, err := cluster.Client.CoreV1().ServiceAccounts("ebb-system").CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(cluster.Config)
	cfg.BearerToken = tok.Status.Token
	lb := e2eutil.APIClientFor(t, cfg)

	var own v1alpha1.LoadBalancerReport
	e2eutil.Eventually(t, ctx, time.Minute, "the replica's own report", func(ctx context.Context) (bool, string) {
		err := admin.Get(ctx, client.ObjectKey{Name: pod.Name}, &own)
		return err == nil, fmt.Sprint(err)
	})
	other := &v1alpha1.LoadBalancerReport{ObjectMeta: metav1.ObjectMeta{Name: "another-replica"}}
	if err := admin.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), other) })
	// The replica rewrites its report every few seconds: each update starts
	// from the latest.
	updateOwn := func(change func(*v1alpha1.LoadBalancerReport)) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			latest := &v1alpha1.LoadBalancerReport{}
			if err := admin.Get(ctx, client.ObjectKey{Name: pod.Name}, latest); err != nil {
				return fmt.Errorf("reading as the administrator: %w", err)
			}
			change(latest)
			return lb.Status().Update(ctx, latest, client.DryRunAll)
		}
	}

	changes := []change{
		{"update its own report", updateOwn(func(*v1alpha1.LoadBalancerReport) {}), true},
		{"delete its own report", func(ctx context.Context) error {
			return lb.Delete(ctx, own.DeepCopy(), client.DryRunAll)
		}, true},
		{"report another node as its host", updateOwn(func(r *v1alpha1.LoadBalancerReport) { r.Status.HostNode = otherNode() }), false},
		{"create a report for another replica", func(ctx context.Context) error {
			return lb.Create(ctx, &v1alpha1.LoadBalancerReport{ObjectMeta: metav1.ObjectMeta{Name: "not-mine"}}, client.DryRunAll)
		}, false},
		{"delete another replica's report", func(ctx context.Context) error {
			return lb.Delete(ctx, other.DeepCopy(), client.DryRunAll)
		}, false},
	}
	check(t, ctx, changes)
}
