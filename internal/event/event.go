// Package event is how ebb's controllers publish Kubernetes Events: each
// package builds its Events with small named functions (events.go), so that
// a reason, its type and its wording live in one place, and reconcilers
// only say which Event happened.
package event

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
)

// Event is one Kubernetes Event (events.k8s.io/v1) to publish.
type Event struct {
	// Regarding is the object the Event is about; Related, if set,
	// another object it involves.
	Regarding, Related runtime.Object
	// Type is corev1.EventTypeNormal or corev1.EventTypeWarning.
	Type   string
	Reason string
	// Action is what was being done (Ensure, Drain, ...).
	Action string
	Note   string
}

// Publish records e through r.
func Publish(r events.EventRecorder, e Event) {
	r.Eventf(e.Regarding, e.Related, e.Type, e.Reason, e.Action, "%s", e.Note)
}
