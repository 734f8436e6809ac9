// Package maintenance_test drives NodeMaintenance end to end on the local
// cluster, with ebb installed from dist/install-webhook-client-auth.yaml
// (the controller replicas with their admission webhooks, which answer
// only the API server's client certificate, and ebb lb, as pods of ebb's
// image): kubectl-equivalent API calls, as an administrator and as users
// with less power.
package maintenance_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	// lbNode runs ebb: the ebb lb DaemonSet's pod and both controller
	// replicas (an infrastructure node). The tests maintain the other
	// nodes, which carry the apps, without moving ebb.
	lbNode localcluster.Node
)

func TestMain(m *testing.M) {
	dist := e2eutil.DistDir()
	opts := localcluster.Options{Name: "e2e-maintenance", Nodes: 4, RealKubelets: true, Images: []string{filepath.Join(dist, "oci")}}
	os.Exit(localcluster.RunTests(m, opts, &cluster, func(c *localcluster.Cluster) (func(), error) { return setUp(c, dist) }))
}

// setUp installs ebb from dist/install-webhook-client-auth.yaml with ebb
// lb and the controllers on the last node, the VIP pools routed to it; its
// webhooks trust the CA of the API server's client certificate, given
// as a user would (config/components/webhook-client-auth).
func setUp(c *localcluster.Cluster, dist string) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	lbNode = c.Nodes[len(c.Nodes)-1]
	if err := webhookClientCA(ctx, c); err != nil {
		return nil, err
	}
	if err := ebbrun.InstallOnNode(ctx, c, filepath.Join(dist, "install-webhook-client-auth.yaml"), lbNode); err != nil {
		return nil, err
	}
	return func() {}, nil
}

// webhookClientCA writes the ConfigMap ebb-webhook-client-ca that
// config/components/webhook-client-auth mounts into the controller: the
// CA of the client certificate the cluster's API server presents to
// webhooks in ebb-system.
func webhookClientCA(ctx context.Context, c *localcluster.Cluster) error {
	ca, err := os.ReadFile(c.WebhookClientCAFile)
	if err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ebb-system"}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace ebb-system: %w", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ebb-system", Name: "ebb-webhook-client-ca"}, Data: map[string]string{"ca.crt": string(ca)}}
	if _, err := c.Client.CoreV1().ConfigMaps(cm.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the ConfigMap of the webhook client CA: %w", err)
	}
	return nil
}

// lbMetrics scrapes the metrics of the LB node's ebb lb.
func lbMetrics(t *testing.T) string {
	t.Helper()
	page, err := ebbrun.LBPage(context.Background(), cluster, lbNode, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return page
}

// ebbBin is $EBB_BIN, bin/ebb of the checkout (make test sets it): the
// kubectl plugin sits beside it.
func ebbBin() (string, error) {
	bin := os.Getenv("EBB_BIN")
	if bin == "" {
		return "", errors.New("EBB_BIN is not set: run the end-to-end tests with `make test` (it builds bin/ebb)")
	}
	return bin, nil
}

// restartController rolls the controller out with extra flags args
// (none: its installed arguments) and waits until a new replica leads.
func restartController(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err := ebbrun.UpdateControllerArgs(ctx, cluster, func(current []string) []string {
		return append(slices.DeleteFunc(current, func(a string) bool { return slices.Contains(testFlags, a) }), args...)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// testFlags are the flags tests add to the controller (restartController
// takes them away again).
var testFlags = append([]string{"--max-draining-nodes=1"}, evictionGuardFlags...)

// stopController stops every controller replica (kubectl scale
// --replicas=0); startController brings them back.
func stopController(t *testing.T) {
	t.Helper()
	if err := ebbrun.ScaleController(context.Background(), cluster, 0); err != nil {
		t.Fatal(err)
	}
}

func startController(t *testing.T) {
	t.Helper()
	if err := ebbrun.ScaleController(context.Background(), cluster, 2); err != nil {
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
