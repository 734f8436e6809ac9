// Package maintenance_test drives NodeMaintenance end to end on the local
// cluster, with `ebb controller` (and its admission webhooks) and `ebb lb`
// as processes: kubectl-equivalent API calls, as an administrator and as
// users with less power.
package maintenance_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

var (
	cluster *localcluster.Cluster
	// stopController stops the running `ebb controller` (tests restart it).
	stopController func()
	stopLB         func()
)

func TestMain(m *testing.M) {
	os.Exit(localcluster.RunTests(m, localcluster.Options{Name: "e2e-maintenance", Nodes: 3}, &cluster, startEbb))
}

func ebbBin() (string, error) {
	bin := os.Getenv("EBB_BIN")
	if bin == "" {
		return "", errors.New("EBB_BIN is not set: run the end-to-end tests with `make test` (it builds bin/ebb)")
	}
	return bin, nil
}

func startEbb(c *localcluster.Cluster) (func(), error) {
	bin, err := ebbBin()
	if err != nil {
		return nil, err
	}
	if stopController, err = ebbrun.StartController(c, bin); err != nil {
		return nil, err
	}
	if stopLB, err = ebbrun.StartLB(c, bin); err != nil {
		stopController()
		return nil, err
	}
	return func() {
		stopLB()
		stopController()
	}, nil
}

// restartController stops `ebb controller` and starts it again, with
// extra flags args.
func restartController(t *testing.T, args ...string) {
	t.Helper()
	bin, err := ebbBin()
	if err != nil {
		t.Fatal(err)
	}
	stopController()
	if stopController, err = ebbrun.StartController(cluster, bin, args...); err != nil {
		t.Fatal(err)
	}
}

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}()

// warnings collects the apiserver's warnings for a client.
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (w *warnings) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.list...)
}

// newClient returns an administrator's client (impersonating user if not
// empty) and the warnings it receives.
func newClient(t *testing.T, user string) (client.Client, *warnings) {
	t.Helper()
	cfg := rest.CopyConfig(cluster.Config)
	w := &warnings{}
	cfg.WarningHandler = w
	if user != "" {
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c, w
}

func eventually(t *testing.T, ctx context.Context, timeout time.Duration, what string, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	e2eutil.Eventually(t, ctx, timeout, what, cond)
}

// byName selects nodes by name (one term per name: a metadata.name field
// requirement takes one value).
func byName(names ...string) *corev1.NodeSelector {
	sel := &corev1.NodeSelector{}
	for _, n := range names {
		sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, corev1.NodeSelectorTerm{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{n}}},
		})
	}
	return sel
}

func maintenance(name string, stage v1alpha1.NodeMaintenanceStage, sel *corev1.NodeSelector) *v1alpha1.NodeMaintenance {
	return &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.NodeMaintenanceSpec{NodeSelector: sel, Stage: stage, Reason: "e2e " + name},
	}
}

// create creates a maintenance and deletes it (waiting until it is gone)
// after the test.
func create(t *testing.T, ctx context.Context, c client.Client, nm *v1alpha1.NodeMaintenance) {
	t.Helper()
	if err := c.Create(ctx, nm); err != nil {
		t.Fatalf("creating NodeMaintenance %s: %v", nm.Name, err)
	}
	t.Cleanup(func() { deleteAndWait(t, context.Background(), nm.Name) })
}

func deleteAndWait(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	admin, _ := newClient(t, "")
	nm := &v1alpha1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := admin.Delete(ctx, nm); client.IgnoreNotFound(err) != nil {
		t.Errorf("deleting NodeMaintenance %s: %v", name, err)
		return
	}
	eventually(t, ctx, time.Minute, "NodeMaintenance "+name+" to be gone", func(ctx context.Context) (bool, string) {
		err := admin.Get(ctx, client.ObjectKey{Name: name}, nm)
		return client.IgnoreNotFound(err) == nil && err != nil, fmt.Sprintf("still there, stage %s, finalizers %v", nm.Spec.Stage, nm.Finalizers)
	})
}

// setStage moves a maintenance to stage, returning the apiserver's answer.
func setStage(ctx context.Context, c client.Client, name string, stage v1alpha1.NodeMaintenanceStage) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		nm := &v1alpha1.NodeMaintenance{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, nm); err != nil {
			return err
		}
		nm.Spec.Stage = stage
		return c.Update(ctx, nm)
	})
}

func getNM(t *testing.T, ctx context.Context, name string) *v1alpha1.NodeMaintenance {
	t.Helper()
	admin, _ := newClient(t, "")
	nm := &v1alpha1.NodeMaintenance{}
	if err := admin.Get(ctx, client.ObjectKey{Name: name}, nm); err != nil {
		t.Fatal(err)
	}
	return nm
}
