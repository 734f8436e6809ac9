package webhook

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/evacuator"
)

// EvictionGuardPath is where the eviction guard is served; the webhook
// configuration that calls it is opt-in (config/components/eviction-guard).
const EvictionGuardPath = "/validate-pods-eviction"

// EvictionGuard refuses evictions of pods that register evacuators, as
// KEP-4212 has such pods "block eviction requests": a pod that asked to be
// moved by its evacuator (the surge evacuator replaces a single replica
// before it goes) would otherwise lose it to `kubectl drain` or an
// autoscaler evicting it directly. The refusal is a 429, which those
// clients retry as they do for a PodDisruptionBudget, and says how to
// drain instead. Evictions stay allowed for the Exempt users (ebb's own
// Evacuation controller, whose fallback is eviction) and once the pod's
// Evacuation has fallen back to eviction (condition Evicting: its
// evacuators are done or gone).
//
// Its webhook configuration fails open (failurePolicy Ignore): when ebb
// is down, evictions work as they do without ebb.
type EvictionGuard struct {
	// Reader reads pods and Evacuations; an uncached one, so that a
	// registration made a moment ago counts.
	Reader client.Reader
	// Exempt are the users whose evictions pass (ebb controller's
	// service account).
	Exempt []string
}

// Handle answers one eviction's admission review.
func (g *EvictionGuard) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.SubResource != "eviction" || req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	if slices.Contains(g.Exempt, req.UserInfo.Username) {
		return admission.Allowed("ebb's own eviction")
	}
	var pod corev1.Pod
	if err := g.Reader.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: req.Name}, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			return admission.Allowed("") // the Eviction API answers 404 itself
		}
		return failOpen(fmt.Errorf("reading pod %s/%s: %w", req.Namespace, req.Name, err))
	}
	registered := evacuator.Registered(&pod)
	if len(registered) == 0 {
		return admission.Allowed("")
	}
	name := v1alpha1.EvacuationName(pod.UID, pod.Name)
	var e v1alpha1.Evacuation
	err := g.Reader.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, &e)
	switch {
	case err == nil && meta.IsStatusConditionTrue(e.Status.Conditions, v1alpha1.EvictingCondition):
		return admission.Allowed("the pod's evacuators are done: eviction is its Evacuation's fallback")
	case err != nil && !apierrors.IsNotFound(err):
		return failOpen(fmt.Errorf("reading Evacuation %s/%s: %w", pod.Namespace, name, err))
	}
	classes := make([]string, len(registered))
	for i, r := range registered {
		classes[i] = r.EvacuatorClass
	}
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{
		Allowed: false,
		Result: &metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusTooManyRequests, Reason: metav1.StatusReasonTooManyRequests,
			Message: fmt.Sprintf("pod %s/%s registers evacuator(s) %s, which move it without downtime: its evictions are refused until they have had their turn (KEP-4212). "+
				"Drain its node with a NodeMaintenance (kubectl maintenance drain NODE), or create Evacuation %s for it with a finalizer %s<you> (an Evacuation without one is withdrawn at once); the pod is evicted if its evacuators cannot move it",
				pod.Namespace, pod.Name, strings.Join(classes, ", "), name, v1alpha1.InstigatorFinalizerPrefix),
		},
	}}
}

// failOpen lets an eviction through when the guard cannot tell (a read
// failed): the guard must never stop evictions that ebb would not, as its
// webhook configuration's failurePolicy Ignore promises for an unreachable
// ebb. The API server returns the warning to the client.
func failOpen(err error) admission.Response {
	resp := admission.Allowed("")
	resp.Warnings = []string{"ebb's eviction guard could not check this eviction and let it through: " + err.Error()}
	return resp
}
