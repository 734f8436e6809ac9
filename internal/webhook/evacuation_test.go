package webhook

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// newEvacuationWebhook serves pod ns/web (uid u1) registering one
// evacuator; the authorizer lets "evictor" evict pods in ns and nobody
// else anything.
func newEvacuationWebhook(t *testing.T) (*Evacuation, *[]authorizationv1.ResourceAttributes) {
	t.Helper()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	var asked []authorizationv1.ResourceAttributes
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "u1",
		Annotations: map[string]string{v1alpha1.EvacuatorAnnotationPrefix + "surge.maintenance.ebb.dev": "10000/controller"}}}
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pod).WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		sar, ok := obj.(*authorizationv1.SubjectAccessReview)
		if !ok {
			return c.Create(ctx, obj, opts...)
		}
		a := *sar.Spec.ResourceAttributes
		asked = append(asked, a)
		sar.Status.Allowed = sar.Spec.User == "evictor" && a.Namespace == "ns" && a.Verb == "create" && a.Resource == "pods" && a.Subresource == "eviction"
		return nil
	}}).Build()
	return &Evacuation{Client: cl, Pods: cl}, &asked
}

func evacuationOf(name string, uid types.UID, finalizers ...string) *v1alpha1.Evacuation {
	return &v1alpha1.Evacuation{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: v1alpha1.EvacuationName(uid, name), Finalizers: finalizers},
		Spec:       v1alpha1.EvacuationSpec{PodRef: v1alpha1.PodReference{Name: name, UID: uid}},
	}
}

func request(user string, op admissionv1.Operation) context.Context {
	return admission.NewContextWithRequest(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: op, UserInfo: authenticationv1.UserInfo{Username: user}}})
}

// Issue 41 item 10: whoever could create an Evacuation with an instigator
// finalizer had ebb's service account evict the pod; the evacuators were
// taken as written; and an Evacuation under another name than
// <uid>-<name> was invisible to the NodeMaintenance controller, which made
// a second one. Admission now resolves the Evacuation against its pod.
func TestEvacuationAdmission(t *testing.T) {
	w, asked := newEvacuationWebhook(t)
	instigator := v1alpha1.InstigatorFinalizerPrefix + "someone"
	for _, tc := range []struct {
		name string
		user string
		e    *v1alpha1.Evacuation
		want string // "" allowed, else a part of the refusal
	}{
		{"an evictor's request", "evictor", evacuationOf("web", "u1", instigator), ""},
		{"a user who may not evict the pod", "editor", evacuationOf("web", "u1", instigator), "may not evict pod ns/web"},
		{"without a finalizer still needs it", "editor", evacuationOf("web", "u1"), "may not evict pod ns/web"},
		{"another name", "evictor", func() *v1alpha1.Evacuation { e := evacuationOf("web", "u1"); e.Name = "web"; return e }(), `"u1-web"`},
		{"a pod that is gone", "evictor", evacuationOf("gone", "u9", instigator), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := w.ValidateCreate(request(tc.user, admissionv1.Create), tc.e)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want a refusal saying %q", err, tc.want)
			case tc.want != "" && strings.Contains(tc.want, "may not") && !apierrors.IsForbidden(err):
				t.Fatalf("refusal %v is not Forbidden", err)
			}
		})
	}
	for _, a := range *asked {
		if a.Name != "web" && a.Name != "gone" {
			t.Errorf("reviewed %+v, want the Evacuation's pod", a)
		}
	}

	// Adding an instigator finalizer asks for the evacuation: the same
	// check. Withdrawing (removing one) and status-like edits do not.
	stored := evacuationOf("web", "u1", instigator)
	joined := stored.DeepCopy()
	joined.Finalizers = append(joined.Finalizers, v1alpha1.InstigatorFinalizerPrefix+"editor")
	if _, err := w.ValidateUpdate(request("editor", admissionv1.Update), stored, joined); !apierrors.IsForbidden(err) {
		t.Errorf("an editor adding an instigator finalizer: %v, want Forbidden", err)
	}
	if _, err := w.ValidateUpdate(request("evictor", admissionv1.Update), stored, joined); err != nil {
		t.Errorf("an evictor adding an instigator finalizer: %v", err)
	}
	withdrawn := stored.DeepCopy()
	withdrawn.Finalizers = nil
	if _, err := w.ValidateUpdate(request("editor", admissionv1.Update), stored, withdrawn); err != nil {
		t.Errorf("withdrawing: %v", err)
	}
}

// The evacuators are the pod's, whatever the request lists; on updates
// the mutating webhook leaves them (the CRD keeps them immutable).
func TestEvacuatorsAreResolvedFromThePod(t *testing.T) {
	w, _ := newEvacuationWebhook(t)
	forged := []v1alpha1.Evacuator{{EvacuatorClass: "attacker.example", Priority: 2147483647}}
	e := evacuationOf("web", "u1")
	e.Spec.Evacuators = forged
	if err := w.Default(request("evictor", admissionv1.Create), e); err != nil {
		t.Fatal(err)
	}
	want := []v1alpha1.Evacuator{{EvacuatorClass: "surge.maintenance.ebb.dev", Priority: 10000, Role: "controller"}}
	if diff := cmp.Diff(want, e.Spec.Evacuators); diff != "" {
		t.Errorf("evacuators (-want +got):\n%s", diff)
	}
	replaced := evacuationOf("web", "u-other")
	replaced.Spec.Evacuators = forged
	if err := w.Default(request("evictor", admissionv1.Create), replaced); err != nil {
		t.Fatal(err)
	}
	if len(replaced.Spec.Evacuators) != 0 {
		t.Errorf("an Evacuation of a pod replaced under its name lists %v, want none", replaced.Spec.Evacuators)
	}
	update := evacuationOf("web", "u1")
	update.Spec.Evacuators = want
	if err := w.Default(request("evictor", admissionv1.Update), update); err != nil || len(update.Spec.Evacuators) != 1 {
		t.Errorf("an update: %v, evacuators %v, want them as stored", err, update.Spec.Evacuators)
	}
}
