package webhook

import (
	"context"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// Issue 41 item 11: KEP-4212 has pods that register evacuators "block
// eviction requests", so that `kubectl drain` or an autoscaler cannot
// evict a surge-registered single replica directly.
func TestEvictionGuard(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	registered := map[string]string{v1alpha1.EvacuatorAnnotationPrefix + v1alpha1.SurgeEvacuatorClass: v1alpha1.SurgeEvacuatorRegistration}
	pods := []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "plain", UID: "u0"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "surged", UID: "u1", Annotations: registered}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fallback", UID: "u2", Annotations: registered}},
	}
	evicting := &v1alpha1.Evacuation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: v1alpha1.EvacuationName("u2", "fallback")},
		Status: v1alpha1.EvacuationStatus{Conditions: []metav1.Condition{{Type: v1alpha1.EvictingCondition, Status: metav1.ConditionTrue, Reason: "EvacuatorsExhausted", LastTransitionTime: metav1.Now()}}}}
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pods[0], pods[1], pods[2], evicting).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if key.Name == "unreadable" {
				return apierrors.NewTooManyRequests("throttled", 1)
			}
			return c.Get(ctx, key, obj, opts...)
		}}).Build()
	g := &EvictionGuard{Reader: cl, Exempt: []string{"system:serviceaccount:ebb-system:ebb-controller"}}
	for _, tc := range []struct {
		name, user, pod, subresource string
		allowed                      bool
	}{
		{"a pod without evacuators", "admin", "plain", "eviction", true},
		{"a pod with an evacuator", "admin", "surged", "eviction", false},
		{"ebb's own eviction", "system:serviceaccount:ebb-system:ebb-controller", "surged", "eviction", true},
		{"once its Evacuation fell back to eviction", "cluster-autoscaler", "fallback", "eviction", true},
		{"a pod that is not there", "admin", "gone", "eviction", true},
		{"not an eviction", "admin", "surged", "status", true},
		{"a pod that cannot be read: fails open", "admin", "unreadable", "eviction", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := g.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
				Operation: admissionv1.Create, Namespace: "ns", Name: tc.pod, SubResource: tc.subresource,
				UserInfo: authenticationv1.UserInfo{Username: tc.user}}})
			if resp.Allowed != tc.allowed {
				t.Fatalf("allowed %v, want %v (%+v)", resp.Allowed, tc.allowed, resp.Result)
			}
			if tc.pod == "unreadable" && len(resp.Warnings) == 0 {
				t.Error("let through without a warning that the guard could not check")
			}
			if !tc.allowed && (resp.Result.Code != http.StatusTooManyRequests || !strings.Contains(resp.Result.Message, "registers evacuator(s) "+v1alpha1.SurgeEvacuatorClass) ||
				!strings.Contains(resp.Result.Message, "NodeMaintenance")) {
				t.Errorf("refusal %d %q, want a 429 that names the evacuator and how to drain", resp.Result.Code, resp.Result.Message)
			}
		})
	}
}
