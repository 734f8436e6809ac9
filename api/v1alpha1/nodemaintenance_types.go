package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeMaintenanceStage is a stage of a maintenance. The order is
// Idle -> Cordon -> Drain -> Complete; Cordon and Drain can be skipped.
// +kubebuilder:validation:Enum=Idle;Cordon;Drain;Complete
type NodeMaintenanceStage string

const (
	// Idle does not interact with the cluster (a planned maintenance).
	Idle NodeMaintenanceStage = "Idle"
	// Cordon makes every selected node unschedulable.
	Cordon NodeMaintenanceStage = "Cordon"
	// Drain cordons every selected node and evacuates its pods, in the
	// order of the drain plan.
	Drain NodeMaintenanceStage = "Drain"
	// Complete removes this maintenance's Evacuations and makes the nodes
	// schedulable again, unless another maintenance still covers them.
	Complete NodeMaintenanceStage = "Complete"
)

// PodType selects pods by what runs them.
// +kubebuilder:validation:Enum=Default;DaemonSet;Static
type PodType string

const (
	// Default selects all pods except DaemonSet and static pods.
	Default PodType = "Default"
	// DaemonSet selects pods owned by a DaemonSet.
	DaemonSet PodType = "DaemonSet"
	// Static selects static (mirror) pods.
	Static PodType = "Static"
)

// Finalizers and condition names.
const (
	// MaintenanceCompletionFinalizer keeps a maintenance that left Idle
	// until its Complete stage has run.
	MaintenanceCompletionFinalizer = "maintenance.ebb.dev/maintenance-completion"
	// InstigatorFinalizerPrefix + an instigator's name is the finalizer
	// an instigator holds on an Evacuation.
	InstigatorFinalizerPrefix = "maintenance.ebb.dev/instigator_"
	// NodeMaintenanceInstigator is the node maintenance controller's
	// instigator name.
	NodeMaintenanceInstigator = "nodemaintenance"
	// EvacuatorAnnotationPrefix + an evacuator class, on a pod, registers
	// an evacuator: "<priority>/<role>".
	EvacuatorAnnotationPrefix = "maintenance.ebb.dev/evacuator-priority_"
	// RequestedByAnnotation, on an Evacuation the node maintenance
	// controller created, names the NodeMaintenance whose drain asked for
	// it (other maintenances on the node may share it later), and
	// ReasonAnnotation carries that maintenance's spec.reason, so that the
	// owner of an evacuated pod can see why.
	RequestedByAnnotation = "maintenance.ebb.dev/requested-by"
	ReasonAnnotation      = "maintenance.ebb.dev/reason"

	// DrainedCondition is True once every targeted pod on every selected
	// node has terminated during the Drain stage.
	DrainedCondition = "Drained"
	// ReconciledCondition is True when the controller's last pass over
	// the maintenance succeeded, and False with the failing step
	// (CordonFailed, TaintFailed, DrainFailed, CompleteFailed,
	// ReleaseFailed) and the error while one fails.
	ReconciledCondition = "Reconciled"

	// Node conditions published during a maintenance (KEP-5683's names).
	NodeConditionMaintenanceInProgress = "MaintenanceInProgress"
	NodeConditionDrainInProgress       = "DrainInProgress"
	NodeConditionDrained               = "Drained"
)

// DrainPlanEntry selects pods to evacuate.
type DrainPlanEntry struct {
	// PodSelector selects pods by their labels; it can make some pods of
	// the same priority leave before others.
	// +optional
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`
	// PodPriority: pods with a priority less than or equal to it are
	// selected.
	PodPriority int32 `json:"podPriority"`
	// PodType selects pods by type: Default (all but DaemonSet and static
	// pods), DaemonSet or Static.
	// +kubebuilder:default=Default
	PodType PodType `json:"podType"`
}

// NodeMaintenanceSpec is the desired maintenance.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.drainPlan) || (has(self.drainPlan) && self.drainPlan == oldSelf.drainPlan)",message="spec.drainPlan is immutable: create a new NodeMaintenance for another plan"
// +kubebuilder:validation:XValidation:rule="oldSelf.stage == self.stage || oldSelf.stage == 'Idle' || (oldSelf.stage == 'Cordon' && self.stage in ['Drain', 'Complete']) || (oldSelf.stage == 'Drain' && self.stage == 'Complete')",message="spec.stage can only move forward: Idle -> Cordon | Drain | Complete, Cordon -> Drain | Complete, Drain -> Complete; Complete is final"
type NodeMaintenanceSpec struct {
	// NodeSelector selects the nodes under maintenance.
	// +kubebuilder:validation:Required
	NodeSelector *corev1.NodeSelector `json:"nodeSelector,omitempty"`
	// Stage of the maintenance: Idle (planned), Cordon, Drain or Complete.
	// Stages only move forward; Cordon and Drain can be skipped; deleting
	// a maintenance that left Idle moves it to Complete first.
	// +kubebuilder:default=Idle
	// +optional
	Stage NodeMaintenanceStage `json:"stage,omitempty"`
	// DrainPlan is executed from the first entry to the last during the
	// Drain stage. Entries are ordered by podType (Default, DaemonSet,
	// Static) and by ascending podPriority within a type; no duplicates.
	// Admission adds the default entries (priorities 1000000000,
	// 2000000000, 2000001000 and 2147483647 of each type) when missing.
	// Immutable.
	// +kubebuilder:validation:MaxItems=100
	// +listType=atomic
	// +optional
	DrainPlan []DrainPlanEntry `json:"drainPlan,omitempty"`
	// TrafficDrainTimeoutSeconds bounds how long, once the node's pods are
	// gone, Drained waits for the load balancers to report no established
	// connection through the node (ebb's addition). Default 300.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	// +kubebuilder:default=300
	// +optional
	TrafficDrainTimeoutSeconds *int32 `json:"trafficDrainTimeoutSeconds,omitempty"`
	// Reason for the maintenance, for people.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Reason string `json:"reason,omitempty"`
}

// StageStatus records when a stage started.
type StageStatus struct {
	// Name of the stage.
	Name NodeMaintenanceStage `json:"name"`
	// StartTimestamp is when the stage started.
	StartTimestamp *metav1.Time `json:"startTimestamp,omitempty"`
}

// NodeReference names a node.
type NodeReference struct {
	// Name of the node.
	Name string `json:"name"`
}

// NodeMaintenanceNodeStatus is the maintenance of one node.
type NodeMaintenanceNodeStatus struct {
	// NodeRef is the node.
	NodeRef NodeReference `json:"nodeRef"`
	// DrainTargets are the pods of this node currently targeted for
	// evacuation. They only move forward; with several maintenances on a
	// node, the least advanced targets among them apply.
	// +optional
	DrainTargets []DrainPlanEntry `json:"drainTargets,omitempty"`
	// DrainPlanIndex is the entry of spec.drainPlan this node has reached
	// (ebb's addition): the maintenance's own, or less for a node that
	// joined the drain late and is catching up from the first entry.
	// Absent on a status written before ebb recorded it: the
	// maintenance's.
	// +optional
	DrainPlanIndex *int32 `json:"drainPlanIndex,omitempty"`
	// DrainMessage says how the drain of this node goes and why the
	// targets are what they are.
	// +optional
	DrainMessage string `json:"drainMessage,omitempty"`
	// PodsPendingEvacuation counts pods that have not started evacuation.
	PodsPendingEvacuation int32 `json:"podsPendingEvacuation"`
	// PodsEvacuating counts pods with an Evacuation.
	PodsEvacuating int32 `json:"podsEvacuating"`
	// TrafficDrainStartTime is when every load balancer had turned the
	// node's backends Down (ebb's addition).
	// +optional
	TrafficDrainStartTime *metav1.Time `json:"trafficDrainStartTime,omitempty"`
	// EstablishedConnections the load balancers still report through the
	// node (ebb's addition).
	// +optional
	EstablishedConnections int64 `json:"establishedConnections,omitempty"`
	// PodsTotal is the most pods (static ones excluded) seen on the node
	// during the drain, so PodsTotal - PodsPendingEvacuation -
	// PodsEvacuating have left (ebb's addition to the KEP, for progress).
	// +optional
	PodsTotal int32 `json:"podsTotal,omitempty"`
	// Drained says this maintenance is done with the node: every pod its
	// drain targets select has terminated and the load balancers carry no
	// more traffic through it (ebb's addition). The node's Drained
	// condition is True when every maintenance draining it says so.
	// +optional
	Drained bool `json:"drained,omitempty"`
}

// NodeMaintenanceStatus is the observed maintenance.
type NodeMaintenanceStatus struct {
	// StageStatuses records the stages started, in order.
	// +optional
	StageStatuses []StageStatus `json:"stageStatuses,omitempty"`
	// NodeStatuses is one entry per selected node, sorted by name.
	// +optional
	NodeStatuses []NodeMaintenanceNodeStatus `json:"nodeStatuses,omitempty"`
	// NodeCount is how many nodes the maintenance selects (ebb's
	// addition, for `kubectl get`).
	// +optional
	NodeCount int32 `json:"nodeCount,omitempty"`
	// DrainPlanIndex is the entry of spec.drainPlan this maintenance has
	// reached (ebb's addition to the KEP: it keeps the progress across
	// restarts, since drain targets never move backwards).
	// +optional
	DrainPlanIndex int32 `json:"drainPlanIndex,omitempty"`
	// Conditions: Drained.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NodeMaintenance is a request to cordon and drain a set of nodes.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=nm
// +kubebuilder:printcolumn:name="Stage",type=string,JSONPath=`.spec.stage`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodeCount`
// +kubebuilder:printcolumn:name="Drained",type=string,JSONPath=`.status.conditions[?(@.type=="Drained")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.spec.reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeMaintenance struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeMaintenanceSpec   `json:"spec"`
	Status NodeMaintenanceStatus `json:"status,omitempty"`
}

// NodeMaintenanceList is a list of NodeMaintenances.
// +kubebuilder:object:root=true
type NodeMaintenanceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeMaintenance `json:"items"`
}
