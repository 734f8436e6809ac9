package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
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
	"github.com/ebbdev/ebb/internal/drainplan"
)

// newWebhook serves three nodes, a and b labelled pool=blue; the
// authorizer lets "admin" delete every node and "operator" only a and b.
func newWebhook(t *testing.T) *NodeMaintenance {
	t.Helper()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	blue := map[string]string{"pool": "blue"}
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: blue}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b", Labels: blue}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "c"}},
	).WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		sar, ok := obj.(*authorizationv1.SubjectAccessReview)
		if !ok {
			return c.Create(ctx, obj, opts...)
		}
		node := sar.Spec.ResourceAttributes.Name
		sar.Status.Allowed = sar.Spec.User == "admin" || sar.Spec.User == "operator" && (node == "a" || node == "b")
		return nil
	}}).Build()
	return &NodeMaintenance{Client: cl}
}

func as(user string) context.Context {
	return admission.NewContextWithRequest(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UserInfo: authenticationv1.UserInfo{Username: user}}})
}

func maintenance(stage v1alpha1.NodeMaintenanceStage, sel *corev1.NodeSelector, plan ...v1alpha1.DrainPlanEntry) *v1alpha1.NodeMaintenance {
	if plan == nil {
		plan = drainplan.Defaults()
	}
	return &v1alpha1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: v1alpha1.NodeMaintenanceSpec{Stage: stage, NodeSelector: sel, DrainPlan: plan}}
}

func byLabel(k, v string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{v}}}}}}
}

// everyNode selects every node (a term without requirements selects none).
var everyNode = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"no-such-node"}}}}}}

// wantErr checks an admission answer: "" means allowed, else the error
// must be of the given kind and say the given text.
func wantErr(t *testing.T, err error, kind, text string) {
	t.Helper()
	switch {
	case kind == "" && err != nil:
		t.Errorf("rejected: %v", err)
	case kind == "invalid" && !apierrors.IsInvalid(err), kind == "forbidden" && !apierrors.IsForbidden(err):
		t.Errorf("got %v, want %s", err, kind)
	case kind != "" && !strings.Contains(err.Error(), text):
		t.Errorf("message %q does not say %q", err.Error(), text)
	}
}

func TestValidateCreate(t *testing.T) {
	dup := drainplan.Defaults()
	dup = append(dup, dup[0])
	for _, tt := range []struct {
		name, user string
		nm         *v1alpha1.NodeMaintenance
		kind, text string
		warning    bool
	}{
		{"no selector", "admin", maintenance(v1alpha1.Idle, nil), "invalid", "select the nodes to maintain", false},
		{"no terms", "admin", maintenance(v1alpha1.Idle, &corev1.NodeSelector{}), "invalid", "at least one term", false},
		{"only an empty term (selects nothing)", "admin", maintenance(v1alpha1.Idle, &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{}}}), "invalid", "selects no node", false},
		{"bad operator", "admin", maintenance(v1alpha1.Idle, &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "k", Operator: "Near"}}}}}), "invalid", "spec.nodeSelector", false},
		{"duplicate plan entry", "admin", maintenance(v1alpha1.Idle, byLabel("pool", "blue"), dup...), "invalid", "spec.drainPlan", false},
		{"operator on its nodes", "operator", maintenance(v1alpha1.Drain, byLabel("pool", "blue")), "", "", false},
		{"operator beyond its nodes", "operator", maintenance(v1alpha1.Drain, everyNode), "forbidden", `user "operator" may not delete node(s) c`, false},
		{"every node: a warning", "admin", maintenance(v1alpha1.Idle, everyNode), "", "", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			warnings, err := newWebhook(t).ValidateCreate(as(tt.user), tt.nm)
			wantErr(t, err, tt.kind, tt.text)
			if got := len(warnings) > 0; got != tt.warning {
				t.Errorf("warnings %q, want a warning: %v", warnings, tt.warning)
			}
		})
	}
}

// An update needs what it changes: the added nodes when the selection
// grows, every selected node when the stage changes, nothing when the
// controller completes a maintenance being deleted.
func TestValidateUpdate(t *testing.T) {
	onlyA := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}
	deleting := maintenance(v1alpha1.Complete, everyNode)
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	for _, tt := range []struct {
		name     string
		old, new *v1alpha1.NodeMaintenance
		kind     string
	}{
		{"widened within its nodes", maintenance(v1alpha1.Idle, onlyA), maintenance(v1alpha1.Idle, byLabel("pool", "blue")), ""},
		{"widened beyond its nodes", maintenance(v1alpha1.Idle, onlyA), maintenance(v1alpha1.Idle, everyNode), "forbidden"},
		{"someone's maintenance over every node moved to Drain", maintenance(v1alpha1.Idle, everyNode), maintenance(v1alpha1.Drain, everyNode), "forbidden"},
		{"unchanged stage and selection", maintenance(v1alpha1.Drain, everyNode), maintenance(v1alpha1.Drain, everyNode), ""},
		{"the controller completing a deleted maintenance", maintenance(v1alpha1.Drain, everyNode), deleting, ""},
		// Narrowing releases the nodes dropped (uncordoned, untainted, put
		// back into service): it needs what adding them needed (issue 41
		// item 2).
		{"narrowed within its nodes", maintenance(v1alpha1.Drain, byLabel("pool", "blue")), maintenance(v1alpha1.Drain, onlyA), ""},
		{"narrowed, releasing a node one may not delete", maintenance(v1alpha1.Drain, everyNode), maintenance(v1alpha1.Drain, onlyA), "forbidden"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := newWebhook(t).ValidateUpdate(as("operator"), tt.old, tt.new)
			wantErr(t, err, tt.kind, "may not delete")
		})
	}
}

func TestValidateDeleteAndDefault(t *testing.T) {
	w := newWebhook(t)
	if _, err := w.ValidateDelete(as("operator"), maintenance(v1alpha1.Drain, everyNode)); !apierrors.IsForbidden(err) {
		t.Errorf("deleting a maintenance of nodes one may not delete: %v", err)
	}
	if _, err := w.ValidateDelete(as("operator"), maintenance(v1alpha1.Drain, byLabel("pool", "blue"))); err != nil {
		t.Errorf("deleting one's own: %v", err)
	}
	nm := maintenance("", everyNode, v1alpha1.DrainPlanEntry{PodPriority: 5000, PodType: v1alpha1.Default})
	if err := w.Default(context.Background(), nm); err != nil {
		t.Fatal(err)
	}
	if nm.Spec.Stage != v1alpha1.Idle || len(nm.Spec.DrainPlan) != len(drainplan.Defaults())+1 {
		t.Errorf("defaulted: stage %q, %d plan entries, want Idle and the defaults plus one", nm.Spec.Stage, len(nm.Spec.DrainPlan))
	}
}

// validateSpec takes user input: whatever the spec, it never panics, an
// accepted spec has a selector, and defaulting keeps a valid plan valid.
func FuzzValidateSpec(f *testing.F) {
	for _, seed := range []string{
		`{"nodeSelector":{"nodeSelectorTerms":[{"matchFields":[{"key":"metadata.name","operator":"In","values":["a"]}]}]}}`,
		`{"nodeSelector":{"nodeSelectorTerms":[{}]},"drainPlan":[{"podPriority":5000,"podType":"Default"},{"podPriority":1,"podType":"DaemonSet","podSelector":{"matchLabels":{"app":"x"}}}]}`,
		`{"nodeSelector":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"k","operator":"Gt","values":["x"]}]}]}}`,
		`{"drainPlan":[{"podPriority":-1,"podType":"Static"},{"podPriority":-1,"podType":"Static"}]}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		nm := &v1alpha1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Name: "m"}}
		if json.Unmarshal([]byte(spec), &nm.Spec) != nil {
			return
		}
		sel, err := validateSpec(nm)
		if err == nil && sel == nil {
			t.Fatalf("accepted %s without a selector", spec)
		}
		if err != nil {
			return
		}
		if errs := drainplan.Validate(drainplan.WithDefaults(nm.Spec.DrainPlan), nil); len(errs) > 0 {
			t.Fatalf("defaulting made the valid plan of %s invalid: %v", spec, errs)
		}
	})
}

// The plan is defaulted once, when first set (issue 41 item 5): an update
// of a maintenance whose stored plan lacks the defaults (created while
// the webhook was off) keeps it as stored, or the CRD's immutability rule
// would refuse that update and every later one, the finalizer's removal
// included. An update that sets the plan for the first time defaults it.
func TestDefaultingTheDrainPlanOnlyWhenFirstSet(t *testing.T) {
	w := newWebhook(t)
	userPlan := []v1alpha1.DrainPlanEntry{{PodType: v1alpha1.Default, PodPriority: 100}}
	updateOf := func(old *v1alpha1.NodeMaintenance) context.Context {
		raw, err := json.Marshal(old)
		if err != nil {
			t.Fatal(err)
		}
		return admission.NewContextWithRequest(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Operation: admissionv1.Update, OldObject: runtime.RawExtension{Raw: raw}}})
	}
	stored := maintenance(v1alpha1.Drain, everyNode)
	stored.Spec.DrainPlan = slices.Clone(userPlan)
	update := updateOf(stored.DeepCopy())
	if err := w.Default(update, stored); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(stored.Spec.DrainPlan, userPlan) {
		t.Errorf("an update changed the stored plan to %d entries: the CRD would refuse it", len(stored.Spec.DrainPlan))
	}
	unset := maintenance(v1alpha1.Drain, everyNode)
	unset.Spec.DrainPlan = nil
	firstSet := unset.DeepCopy()
	if err := w.Default(updateOf(unset.DeepCopy()), unset); err != nil {
		t.Fatal(err)
	}
	if len(unset.Spec.DrainPlan) != len(drainplan.Defaults()) {
		t.Errorf("an update that sets no plan got %d entries, want the defaults", len(unset.Spec.DrainPlan))
	}
	// The first update that sets a plan on an object stored without one
	// gets the defaults too.
	old := firstSet.DeepCopy()
	firstSet.Spec.DrainPlan = slices.Clone(userPlan)
	if err := w.Default(updateOf(old), firstSet); err != nil {
		t.Fatal(err)
	}
	if len(firstSet.Spec.DrainPlan) != len(drainplan.Defaults())+1 {
		t.Errorf("a plan set by an update on an object stored without one: %d entries, want the defaults plus it", len(firstSet.Spec.DrainPlan))
	}
	create := admission.NewContextWithRequest(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: admissionv1.Create}})
	created := maintenance(v1alpha1.Drain, everyNode)
	created.Spec.DrainPlan = slices.Clone(userPlan)
	if err := w.Default(create, created); err != nil {
		t.Fatal(err)
	}
	if len(created.Spec.DrainPlan) != len(drainplan.Defaults())+1 {
		t.Errorf("created with one entry: %d entries, want the defaults plus it", len(created.Spec.DrainPlan))
	}
}

// A change that concerns more than MaxNodeReviews nodes, by a user who may
// not delete every node, is refused after one review instead of one per
// node (issue 42 item 4: 1,000 nodes cost 1,001 reviews, and admission,
// which every NodeMaintenance write waits for, could be starved); an
// administrator still passes with one.
func TestManyNodesCostOneReview(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	var objs []client.Object
	for i := range MaxNodeReviews + 50 {
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%03d", i), Labels: map[string]string{"pool": "blue"}}})
	}
	reviews := 0
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		sar, ok := obj.(*authorizationv1.SubjectAccessReview)
		if !ok {
			return c.Create(ctx, obj, opts...)
		}
		reviews++
		sar.Status.Allowed = sar.Spec.User == "admin" || sar.Spec.User == "operator" && sar.Spec.ResourceAttributes.Name != ""
		return nil
	}}).Build()
	w := &NodeMaintenance{Client: cl}
	_, err := w.ValidateCreate(as("operator"), maintenance(v1alpha1.Idle, byLabel("pool", "blue")))
	wantErr(t, err, "forbidden", fmt.Sprintf("this change concerns %d nodes: above %d", MaxNodeReviews+50, MaxNodeReviews))
	if reviews != 1 {
		t.Errorf("%d SubjectAccessReviews for one request, want 1", reviews)
	}
	reviews = 0
	if _, err := w.ValidateCreate(as("admin"), maintenance(v1alpha1.Idle, byLabel("pool", "blue"))); err != nil || reviews != 1 {
		t.Errorf("an administrator: %v after %d reviews, want allowed after 1", err, reviews)
	}
}
