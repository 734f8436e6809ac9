package v1alpha1

// Well-known names of node maintenance: the labels, annotations, taint
// values, finalizers, conditions and event reasons that ebb's controllers
// write and that users, the kubectl plugin, the demo, benchmarks and tests
// read. One home, so that a reader does not import a controller to learn
// a name.

// On nodes.
const (
	// CordonAnnotation records on a node who cordoned it for maintenance:
	// "ebb" when a maintenance did, "preexisting" when it was already
	// unschedulable. Complete only uncordons what ebb cordoned.
	CordonAnnotation = "maintenance.ebb.dev/cordon"
	// DrainingTaintValue is the value of the ebb.dev/draining taint while
	// a maintenance drains the node (key: lbmodel.TaintDraining).
	DrainingTaintValue = "maintenance"
)

// On Evacuations.
const (
	// InstigatorFinalizer is the node maintenance controller's finalizer
	// on the Evacuations it requests.
	InstigatorFinalizer = InstigatorFinalizerPrefix + NodeMaintenanceInstigator
	// EvacuationNodeLabel on an Evacuation names the pod's node.
	EvacuationNodeLabel = "maintenance.ebb.dev/node"
	// EvictingCondition is True once the Evacuation controller fell back
	// to the Eviction API (no evacuator, or none left).
	EvictingCondition = "Evicting"
)

// The surge evacuator: a Deployment's pod is replaced before it goes.
const (
	// SurgeEvacuatorClass is the surge evacuator's evacuator class.
	SurgeEvacuatorClass = "surge.maintenance.ebb.dev"
	// SurgeEvacuatorRegistration is the priority and role the surge
	// evacuator registers on opted-in pods (evacuator annotation value).
	SurgeEvacuatorRegistration = "10000/controller"
	// SurgeEvacuationAnnotation set to "true" on a Deployment asks for
	// surge evacuation of its pods.
	SurgeEvacuationAnnotation = "maintenance.ebb.dev/surge-evacuation"
	// SurgeLockAnnotation on a Deployment: "<evacuation>/<phase>" while
	// one of its pods is being moved (one at a time).
	SurgeLockAnnotation = "maintenance.ebb.dev/surge-lock"
	// SurgeOriginalReplicasAnnotation on a Deployment: the replica count
	// to restore after a surge.
	SurgeOriginalReplicasAnnotation = "maintenance.ebb.dev/surge-original-replicas"
	// SurgeRetriesAnnotation on an Evacuation: how often its surge started
	// again because the ReplicaSet removed another pod (at most 3, then
	// the next evacuator takes over).
	SurgeRetriesAnnotation = "maintenance.ebb.dev/surge-retries"
)

// AllowNoLoadBalancerAnnotation set to "true" on a NodeMaintenance lets it
// drain every node that hosts a serving `ebb lb` replica, which admission
// otherwise refuses (no host would be left to announce and accept the
// load-balancer addresses).
const AllowNoLoadBalancerAnnotation = "maintenance.ebb.dev/allow-no-load-balancer"

// Event reasons on a NodeMaintenance.
const (
	ReasonStageStarted  = "StageStarted"
	ReasonRecordoned    = "Recordoned"
	ReasonDrained       = "Drained"
	ReasonFastForwarded = "FastForwarded"
	ReasonNodeReleased  = "NodeReleased"
	// ReasonDrainPlanDefaulted: the controller gave a maintenance without
	// a drain plan the default one (admission was not there to).
	ReasonDrainPlanDefaulted = "DrainPlanDefaulted"
	// ReasonWaitingForDrainSlot: the maintenance is in Drain but waits
	// until fewer nodes drain (ebb controller --max-draining-nodes); also
	// the reason of its Drained=False condition meanwhile.
	ReasonWaitingForDrainSlot = "WaitingForDrainSlot"
	// ReasonLoadBalancersNotDown: the load balancers did not report a
	// node's backends Down in time; evacuation started anyway.
	ReasonLoadBalancersNotDown = "LoadBalancersNotDown"
	// ReasonTrafficDrainTimeout: established connections outlived the
	// traffic-drain timeout; the node counts as drained.
	ReasonTrafficDrainTimeout = "TrafficDrainTimeout"
)

// Event reasons on an Evacuation.
const (
	ReasonEvacuatorSelected = "EvacuatorSelected"
	ReasonEvacuatorExpired  = "EvacuatorDeadlineExceeded"
	ReasonEvictionBlocked   = "EvictionBlocked"
	ReasonEvicted           = "Evicted"
)
