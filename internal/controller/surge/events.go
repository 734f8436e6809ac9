package surge

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/event"
)

func surging(e *v1alpha1.Evacuation, dep *appsv1.Deployment, pod *corev1.Pod, original int32) event.Event {
	return event.Event{Regarding: e, Related: dep, Type: corev1.EventTypeNormal, Reason: "Surging", Action: "Surge",
		Note: fmt.Sprintf("Scaled Deployment %s from %d to %d to move pod %s", dep.Name, original, original+1, pod.Name)}
}

func surgeSkipped(e *v1alpha1.Evacuation, why string) event.Event {
	return event.Event{Regarding: e, Type: corev1.EventTypeNormal, Reason: "SurgeSkipped", Action: "Surge", Note: why + "; handing on"}
}

func surgeRetried(e *v1alpha1.Evacuation, dep *appsv1.Deployment, why string) event.Event {
	return event.Event{Regarding: e, Related: dep, Type: corev1.EventTypeWarning, Reason: "SurgeRetried", Action: "Surge", Note: why}
}
