package v1alpha1

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// EvacuatorRole says how an evacuator relates to the pod.
type EvacuatorRole string

// EvacuationCancellationPolicy says whether an evacuation in progress may
// be cancelled.
// +kubebuilder:validation:Enum=Allow;Forbid
type EvacuationCancellationPolicy string

const (
	// CancellationAllow lets instigators withdraw the evacuation.
	CancellationAllow EvacuationCancellationPolicy = "Allow"
	// CancellationForbid keeps the evacuation going until the pod is gone.
	CancellationForbid EvacuationCancellationPolicy = "Forbid"
)

// MaxEvacuators is how many evacuators an Evacuation lists at most: the
// highest priorities a pod registers (a bound, so that a pod cannot make
// every Evacuation of it, and each hand-off, as large as it likes).
const MaxEvacuators = 16

// DefaultProgressDeadlineSeconds is how long an evacuator may make no
// progress before the next one is tried.
const DefaultProgressDeadlineSeconds = 1800

// PodReference names a pod and pins its UID.
type PodReference struct {
	// Name of the pod.
	Name string `json:"name"`
	// UID of the pod.
	UID types.UID `json:"uid"`
}

// Evacuator is one registered evacuator of the pod.
type Evacuator struct {
	// EvacuatorClass names the evacuator.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	EvacuatorClass string `json:"evacuatorClass"`
	// Priority: the highest goes first.
	Priority int32 `json:"priority"`
	// Role, e.g. controller.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Role EvacuatorRole `json:"role,omitempty"`
}

// EvacuationSpec is a request to move a pod off its node.
// +kubebuilder:validation:XValidation:rule="self.podRef == oldSelf.podRef",message="spec.podRef is immutable"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.progressDeadlineSeconds) || self.progressDeadlineSeconds == oldSelf.progressDeadlineSeconds",message="spec.progressDeadlineSeconds is immutable"
// +kubebuilder:validation:XValidation:rule="(has(self.evacuators) && has(oldSelf.evacuators)) ? self.evacuators == oldSelf.evacuators : ((!has(self.evacuators) || size(self.evacuators) == 0) && (!has(oldSelf.evacuators) || size(oldSelf.evacuators) == 0))",message="spec.evacuators is immutable: admission resolves them from the pod's evacuator annotations when the Evacuation is created"
type EvacuationSpec struct {
	// PodRef is the pod to evacuate.
	PodRef PodReference `json:"podRef"`
	// ProgressDeadlineSeconds: an evacuator that makes no progress for
	// this long is replaced by the next one (or by eviction). 600 to
	// 21600, default 1800. Immutable.
	// +kubebuilder:validation:Minimum=600
	// +kubebuilder:validation:Maximum=21600
	// +kubebuilder:default=1800
	// +optional
	ProgressDeadlineSeconds int32 `json:"progressDeadlineSeconds,omitempty"`
	// Evacuators registered on the pod when the Evacuation was created:
	// admission resolves them from the pod's evacuator annotations
	// (what a request lists is replaced), at most MaxEvacuators, the
	// highest priorities. Immutable.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Evacuators []Evacuator `json:"evacuators,omitempty"`
}

// EvacuationStatus is the observed evacuation.
type EvacuationStatus struct {
	// ActiveEvacuatorClass is the evacuator now in charge.
	// +optional
	ActiveEvacuatorClass string `json:"activeEvacuatorClass,omitempty"`
	// ActiveEvacuatorCompleted is set by the active evacuator when done.
	// +optional
	ActiveEvacuatorCompleted bool `json:"activeEvacuatorCompleted,omitempty"`
	// EvacuationProgressTimestamp is the active evacuator's last progress.
	// +optional
	EvacuationProgressTimestamp *metav1.Time `json:"evacuationProgressTimestamp,omitempty"`
	// ExpectedEvacuationFinishTime is the active evacuator's estimate.
	// +optional
	ExpectedEvacuationFinishTime *metav1.Time `json:"expectedEvacuationFinishTime,omitempty"`
	// EvacuationCancellationPolicy: Allow or Forbid.
	// +optional
	EvacuationCancellationPolicy EvacuationCancellationPolicy `json:"evacuationCancellationPolicy,omitempty"`
	// FailedEvictionCounter counts refused evictions.
	// +optional
	FailedEvictionCounter int32 `json:"failedEvictionCounter,omitempty"`
	// NextEvictionTime is when a refused eviction is tried again (2 s
	// doubling to 2 min per refusal); nothing evicts before it, whatever
	// wakes the controller. An ebb addition to KEP-4212's status.
	// +optional
	NextEvictionTime *metav1.Time `json:"nextEvictionTime,omitempty"`
	// Message says what is happening, for people.
	// +optional
	Message string `json:"message,omitempty"`
	// Conditions of the evacuation.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Evacuation asks for a pod to leave its node, through its evacuators or,
// failing them, the Eviction API. It is named <pod UID>-<pod name>.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=evac
// +kubebuilder:printcolumn:name="Pod",type=string,JSONPath=`.spec.podRef.name`
// +kubebuilder:printcolumn:name="Evacuator",type=string,JSONPath=`.status.activeEvacuatorClass`
// +kubebuilder:printcolumn:name="Failed evictions",type=integer,JSONPath=`.status.failedEvictionCounter`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Evacuation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   EvacuationSpec   `json:"spec"`
	Status EvacuationStatus `json:"status,omitempty"`
}

// EvacuationList is a list of Evacuations.
// +kubebuilder:object:root=true
type EvacuationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Evacuation `json:"items"`
}

// EvacuationName is the name of a pod's Evacuation: <pod UID>-<pod name>,
// cut to the longest valid object name.
func EvacuationName(podUID types.UID, podName string) string {
	name := string(podUID) + "-" + podName
	if len(name) > 253 {
		name = strings.TrimRight(name[:253], "-.")
	}
	return name
}
