package evacuation

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/event"
)

func evacuatorExpired(e *v1alpha1.Evacuation, class string, deadline time.Duration) event.Event {
	return event.Event{Regarding: e, Type: corev1.EventTypeWarning, Reason: v1alpha1.ReasonEvacuatorExpired, Action: "HandOff",
		Note: fmt.Sprintf("Evacuator %s made no progress for %s; moving on", class, deadline)}
}

func evacuatorSelected(e *v1alpha1.Evacuation, class string) event.Event {
	return event.Event{Regarding: e, Type: corev1.EventTypeNormal, Reason: v1alpha1.ReasonEvacuatorSelected, Action: "HandOff",
		Note: fmt.Sprintf("Evacuator %s is now in charge", class)}
}

func evicted(e *v1alpha1.Evacuation, pod *corev1.Pod) event.Event {
	return event.Event{Regarding: e, Related: pod, Type: corev1.EventTypeNormal, Reason: v1alpha1.ReasonEvicted, Action: "Evict", Note: "Evicted pod " + pod.Name}
}

// evictionBlocked reports a refused eviction with the status message that
// says why and how often it was refused.
func evictionBlocked(e *v1alpha1.Evacuation, pod *corev1.Pod) event.Event {
	return event.Event{Regarding: e, Related: pod, Type: corev1.EventTypeWarning, Reason: v1alpha1.ReasonEvictionBlocked, Action: "Evict",
		Note: fmt.Sprintf("%s (attempt %d)", e.Status.Message, e.Status.FailedEvictionCounter)}
}
