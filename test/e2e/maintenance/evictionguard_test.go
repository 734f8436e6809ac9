package maintenance_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// evictionGuardFlags are what config/components/eviction-guard adds to the
// controller.
var evictionGuardFlags = []string{"--eviction-guard", "--webhook-validating-configuration=ebb-validating-webhook-configuration,ebb-eviction-guard"}

// Issue 41 item 11, with config/components/eviction-guard: a pod that
// registers an evacuator (here the surge evacuator, on a single replica)
// refuses a direct eviction, as `kubectl drain` or an autoscaler sends it,
// with a 429 that says how to drain instead; a pod without evacuators is
// evicted as before.
func TestEvictionGuardRefusesEvictingAPodWithEvacuators(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	admin, _ := newClient(t, "")
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	single := cluster.AppDeployment(ns, "single", 1)
	single.Annotations = map[string]string{v1alpha1.SurgeEvacuationAnnotation: "true"}
	for _, d := range []client.Object{single, cluster.AppDeployment(ns, "plain", 1)} {
		if err := admin.Create(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"single", "plain"} {
		if err := cluster.WaitDeploymentAvailable(ctx, ns, name, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	surged, plain := appPods(t, ctx, ns, "single")[0], appPods(t, ctx, ns, "plain")[0]
	eventually(t, ctx, 20*time.Second, "the surge evacuator registered on the pod", func(ctx context.Context) (bool, string) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, surged.Name, metav1.GetOptions{})
		return err == nil && p.Annotations[v1alpha1.EvacuatorAnnotationPrefix+v1alpha1.SurgeEvacuatorClass] != "", fmt.Sprint(err)
	})

	// Install the component's webhook configuration and flags, as its
	// kustomization does; take both away after the test.
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "components", "eviction-guard", "eviction-guard.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	guard := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := yaml.Unmarshal(data, guard); err != nil {
		t.Fatal(err)
	}
	if err := admin.Create(ctx, guard); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		restartController(t)
		if err := admin.Delete(context.Background(), guard); err != nil {
			t.Errorf("deleting the eviction guard's configuration: %v", err)
		}
	})
	restartController(t, evictionGuardFlags...)

	evict := func(ctx context.Context, pod string, dryRun bool) error {
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod}}
		if dryRun {
			ev.DeleteOptions = &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
		}
		return cluster.Client.PolicyV1().Evictions(ns).Evict(ctx, ev)
	}
	// The webhook fails open: until the API server reaches it (the CA
	// injected, the new replicas serving), evictions pass. Dry runs show
	// when it answers without evicting anything.
	eventually(t, ctx, time.Minute, "the eviction guard answering", func(ctx context.Context) (bool, string) {
		err := evict(ctx, surged.Name, true)
		return apierrors.IsTooManyRequests(err), fmt.Sprint(err)
	})
	err = evict(ctx, surged.Name, false)
	if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "registers evacuator(s) "+v1alpha1.SurgeEvacuatorClass) || !strings.Contains(err.Error(), "NodeMaintenance") {
		t.Errorf("evicting the surge-registered pod: %v, want a 429 naming the evacuator and how to drain", err)
	}
	if gone, _ := podGone(ctx, ns, surged); gone {
		t.Error("the surge-registered pod was evicted")
	}
	if err := evict(ctx, plain.Name, false); err != nil {
		t.Errorf("evicting a pod without evacuators: %v", err)
	}
	eventually(t, ctx, time.Minute, "the pod without evacuators evicted", func(ctx context.Context) (bool, string) {
		return podGone(ctx, ns, plain)
	})
}
