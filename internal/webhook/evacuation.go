package webhook

import (
	"context"
	"fmt"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/evacuator"
)

// +kubebuilder:webhook:path=/mutate-maintenance-ebb-dev-v1alpha1-evacuation,mutating=true,failurePolicy=fail,sideEffects=None,groups=maintenance.ebb.dev,resources=evacuations,verbs=create,versions=v1alpha1,name=mevacuation.maintenance.ebb.dev,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-maintenance-ebb-dev-v1alpha1-evacuation,mutating=false,failurePolicy=fail,sideEffects=None,groups=maintenance.ebb.dev,resources=evacuations,verbs=create;update,versions=v1alpha1,name=vevacuation.maintenance.ebb.dev,admissionReviewVersions=v1

// +kubebuilder:rbac:groups="",resources=pods,verbs=get

// Evacuation resolves an Evacuation against its pod on admission
// (KEP-4212): its evacuators are the ones the pod registers, its name is
// the one ebb looks it up by, and whoever asks for it may evict the pod.
// An Evacuation with an instigator finalizer makes ebb's Evacuation
// controller evict the pod with ebb's own service account; without this
// check, the permission to create Evacuations would be the permission to
// evict any pod of the namespace.
type Evacuation struct {
	// Client creates SubjectAccessReviews.
	Client client.Client
	// Pods reads the pod named by an Evacuation; an uncached reader, so a
	// pod created a moment ago is found.
	Pods client.Reader
}

// SetupWithManager registers both webhooks on the manager's server.
func (w *Evacuation) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr, &v1alpha1.Evacuation{}).WithDefaulter(w).WithValidator(w).Complete()
}

// Default resolves a new Evacuation's evacuators from its pod's evacuator
// annotations, replacing whatever the request listed: the evacuators are
// the pod owner's choice, and the first of them is handed the pod. A pod
// that is gone (or replaced under its name) registers none; the
// Evacuation controller then ends the Evacuation.
func (w *Evacuation) Default(ctx context.Context, e *v1alpha1.Evacuation) error {
	if req, err := admission.RequestFromContext(ctx); err == nil && req.Operation != admissionv1.Create {
		return nil
	}
	pod, err := w.pod(ctx, e)
	if err != nil {
		return err
	}
	e.Spec.Evacuators = nil
	if pod != nil {
		e.Spec.Evacuators = evacuator.Registered(pod)
	}
	return nil
}

// pod reads the Evacuation's pod: nil when it is gone or another pod has
// its name now.
func (w *Evacuation) pod(ctx context.Context, e *v1alpha1.Evacuation) (*corev1.Pod, error) {
	var pod corev1.Pod
	err := w.Pods.Get(ctx, client.ObjectKey{Namespace: e.Namespace, Name: e.Spec.PodRef.Name}, &pod)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, apierrors.NewInternalError(fmt.Errorf("reading pod %s/%s: %w", e.Namespace, e.Spec.PodRef.Name, err))
	case pod.UID != e.Spec.PodRef.UID:
		return nil, nil
	}
	return &pod, nil
}

// ValidateCreate checks the name rule and that the user may evict the pod.
func (w *Evacuation) ValidateCreate(ctx context.Context, e *v1alpha1.Evacuation) (admission.Warnings, error) {
	if want := v1alpha1.EvacuationName(e.Spec.PodRef.UID, e.Spec.PodRef.Name); e.Name != want {
		return nil, apierrors.NewInvalid(evacuationKind, e.Name, field.ErrorList{field.Invalid(field.NewPath("metadata", "name"), e.Name,
			fmt.Sprintf("an Evacuation is named <pod UID>-<pod name>, here %q: that is how instigators and ebb find a pod's one Evacuation (another name would make a second one)", want))})
	}
	return nil, w.mayEvict(ctx, e, "create it")
}

// ValidateUpdate checks that whoever adds an instigator finalizer (asks
// for the evacuation on an Evacuation someone else created) may evict the
// pod. Removing one (withdrawing) needs nothing more than the update.
func (w *Evacuation) ValidateUpdate(ctx context.Context, old, e *v1alpha1.Evacuation) (admission.Warnings, error) {
	for _, f := range e.Finalizers {
		if strings.HasPrefix(f, v1alpha1.InstigatorFinalizerPrefix) && !slices.Contains(old.Finalizers, f) {
			return nil, w.mayEvict(ctx, e, "add the instigator finalizer "+f)
		}
	}
	return nil, nil
}

// ValidateDelete allows every deletion: deleting an Evacuation withdraws a
// request, which the Evacuation controller honours only as its
// cancellation policy allows.
func (w *Evacuation) ValidateDelete(context.Context, *v1alpha1.Evacuation) (admission.Warnings, error) {
	return nil, nil
}

var evacuationKind = v1alpha1.GroupVersion.WithKind("Evacuation").GroupKind()

// mayEvict asks the authorizer whether the requesting user may create
// pods/eviction for the Evacuation's pod, as the Eviction API would.
func (w *Evacuation) mayEvict(ctx context.Context, e *v1alpha1.Evacuation, what string) error {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return apierrors.NewInternalError(fmt.Errorf("reading the admission request: %w", err))
	}
	user := req.UserInfo
	ok, err := mayDo(ctx, w.Client, user, authorizationv1.ResourceAttributes{
		Namespace: e.Namespace, Verb: "create", Version: "v1", Resource: "pods", Subresource: "eviction", Name: e.Spec.PodRef.Name,
	})
	if err != nil {
		return apierrors.NewInternalError(fmt.Errorf("checking whether %s may evict pod %s/%s: %w", user.Username, e.Namespace, e.Spec.PodRef.Name, err))
	}
	if ok {
		return nil
	}
	return apierrors.NewForbidden(v1alpha1.GroupVersion.WithResource("evacuations").GroupResource(), e.Name, fmt.Errorf(
		"user %q may not evict pod %s/%s, and an Evacuation with an instigator finalizer has ebb evict it: only someone who may create pods/eviction for the pod may %s. Ask for the 'create' permission on pods/eviction in namespace %s",
		user.Username, e.Namespace, e.Spec.PodRef.Name, what, e.Namespace))
}
