package azureadminstate

import (
	"context"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/provider/azure"
	"github.com/ebbdev/ebb/internal/provider/azure/azurefake"
)

func node(name, uid, ip string, taints ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + uid)},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
	for _, k := range taints {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: k, Effect: corev1.TaintEffectNoSchedule})
	}
	return n
}

func entryState(c *azurefake.Cloud, ip string) string {
	for _, e := range c.Pool("kubernetes", "pool").Properties.LoadBalancerBackendAddresses {
		if *e.Properties.IPAddress == ip && e.Properties.AdminState != nil {
			return string(*e.Properties.AdminState)
		}
	}
	return "None"
}

// Two nodes tainted together are written in one call per pool; a failure
// is reported as a Node event and retried; untainting restores None; a
// replacement under the same name is handled afresh.
func TestTaintsDriveAzureAdminState(t *testing.T) {
	cloud := azurefake.New()
	var entries []*armnetwork.LoadBalancerBackendAddress
	for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		entries = append(entries, &armnetwork.LoadBalancerBackendAddress{Name: &ip, Properties: &armnetwork.LoadBalancerBackendAddressPropertiesFormat{IPAddress: &ip}})
	}
	name := "pool"
	cloud.AddPool("kubernetes", armnetwork.BackendAddressPool{Name: &name, Properties: &armnetwork.BackendAddressPoolPropertiesFormat{LoadBalancerBackendAddresses: entries}})
	cfg, err := azure.ParseConfig([]byte(`{"tenantId":"t","subscriptionId":"s","resourceGroup":"rg","useManagedIdentityExtension":true,"loadBalancerBackendPoolConfigurationType":"nodeIP"}`))
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := azure.NewManager(cfg, azurefake.Credential{}, cloud.ClientOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		node("a", "1", "10.0.0.1", lbmodel.TaintOutOfService), node("b", "2", "10.0.0.2", lbmodel.TaintDraining), node("c", "3", "10.0.0.3"),
	).Build()
	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Client: kube, Recorder: rec, Manager: mgr}
	ctx := context.Background()
	req := ctrl.Request{}

	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if entryState(cloud, "10.0.0.1") != "Down" || entryState(cloud, "10.0.0.2") != "Down" || entryState(cloud, "10.0.0.3") != "None" {
		t.Fatalf("states %s %s %s", entryState(cloud, "10.0.0.1"), entryState(cloud, "10.0.0.2"), entryState(cloud, "10.0.0.3"))
	}
	if puts := cloud.Count("put"); puts != 1 {
		t.Errorf("%d writes for two nodes in one pool, want 1", puts)
	}
	if _, err := r.Reconcile(ctx, req); err != nil || cloud.Count("put") != 1 {
		t.Errorf("nothing changed, yet %d writes (%v)", cloud.Count("put"), err)
	}

	// Untaint a, with Azure failing once.
	a := &corev1.Node{}
	_ = kube.Get(ctx, client.ObjectKey{Name: "a"}, a)
	a.Spec.Taints = nil
	_ = kube.Update(ctx, a)
	cloud.FailNext = 1
	if _, err := r.Reconcile(ctx, req); err == nil {
		t.Fatal("the failure was not returned (no retry)")
	}
	if ev := <-rec.Events; !strings.Contains(ev, lbmodel.ReasonAdminStateUpdateFailed) {
		t.Errorf("event %q", ev)
	}
	if entryState(cloud, "10.0.0.1") != "Down" {
		t.Error("a failed write changed the state")
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if entryState(cloud, "10.0.0.1") != "None" {
		t.Error("untainting did not restore None")
	}
}
