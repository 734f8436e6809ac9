package webhook

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// A maintenance that would drain every node hosting a serving ebb lb is
// refused with what to do instead; one that leaves a serving replica, or
// concerns no LB host, is not.
func TestKeepsALoadBalancerHost(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	report := func(name, host string, draining bool, age time.Duration) *v1alpha1.LoadBalancerReport {
		ts := metav1.NewMicroTime(now.Add(-age))
		return &v1alpha1.LoadBalancerReport{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1alpha1.LoadBalancerReportStatus{
			Replica: name, HostNode: host, Draining: draining, RenewTime: &ts, HeartbeatSeconds: 10}}
	}
	leaving := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "ebb.dev/draining", Effect: corev1.TaintEffectNoSchedule}}}}
	for _, tc := range []struct {
		name     string
		objects  []client.Object
		selected []string
		stage    v1alpha1.NodeMaintenanceStage
		allow    bool
		want     string // "" allowed, else a text of the refusal
	}{
		{"another LB host serves", []client.Object{report("lb-a", "a", false, 0), report("lb-b", "b", false, 0)}, []string{"a"}, v1alpha1.Drain, false, ""},
		{"both LB hosts", []client.Object{report("lb-a", "a", false, 0), report("lb-b", "b", false, 0)}, []string{"a", "b"}, v1alpha1.Drain, false,
			"draining a, b would leave no ebb lb serving the load-balancer addresses: every serving replica (lb-a on a, lb-b on b) runs on a node this maintenance drains"},
		{"the other LB host is leaving already", []client.Object{leaving, report("lb-a", "a", false, 0), report("lb-b", "b", false, 0)}, []string{"a"}, v1alpha1.Drain, false, "maintenance.ebb.dev/allow-no-load-balancer=true"},
		{"the other LB host's replica drains already", []client.Object{report("lb-a", "a", false, 0), report("lb-b", "b", true, 0)}, []string{"a"}, v1alpha1.Drain, false, "lb-a on a"},
		{"the annotation overrides", []client.Object{report("lb-a", "a", false, 0)}, []string{"a"}, v1alpha1.Drain, true, ""},
		{"Idle and Cordon drain nothing", []client.Object{report("lb-a", "a", false, 0)}, []string{"a"}, v1alpha1.Cordon, false, ""},
		{"a stale report is a replica that is gone", []client.Object{report("lb-a", "a", false, 0), report("lb-b", "b", false, 10*time.Minute)}, []string{"a"}, v1alpha1.Drain, false, "lb-a on a"},
		{"no replica names its host", []client.Object{report("lb", "", false, 0)}, []string{"a"}, v1alpha1.Drain, false, ""},
		{"not an LB host", []client.Object{report("lb-a", "a", false, 0)}, []string{"c"}, v1alpha1.Drain, false, ""},
		// Fail closed (issue 42 item 5): with no fresh report, an ebb lb
		// pod that runs is a replica whose state is unknown; before, no
		// report meant nothing to protect, and every LB host could be
		// drained.
		{"no fresh report, but ebb lb runs there", []client.Object{lbPod("ebb-lb-x", "a"), report("ebb-lb-x", "a", false, 10*time.Minute)}, []string{"a"}, v1alpha1.Drain, false,
			"ebb-lb-x on a (no fresh LoadBalancerReport)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			_ = clientgoscheme.AddToScheme(scheme)
			_ = v1alpha1.AddToScheme(scheme)
			cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tc.objects...).Build()
			w := &NodeMaintenance{Client: cl, Now: func() time.Time { return now }}
			nm := maintenance(tc.stage, byLabel("pool", "blue"))
			if tc.allow {
				nm.Annotations = map[string]string{v1alpha1.AllowNoLoadBalancerAnnotation: "true"}
			}
			var nodes []*corev1.Node
			var list corev1.NodeList
			if err := cl.List(context.Background(), &list); err != nil {
				t.Fatal(err)
			}
			for i := range list.Items {
				nodes = append(nodes, &list.Items[i])
			}
			err := w.keepsALoadBalancerHost(context.Background(), nm, tc.selected, nodes)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			wantErr(t, err, "forbidden", tc.want)
		})
	}
}

// lbPod is a running ebb lb pod on node.
func lbPod(name, node string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ebb-system", Name: name, Labels: map[string]string{"app.kubernetes.io/name": "ebb-lb"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ebb-lb", UID: "ds", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}
