package nodemaintenance

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/event"
)

func stageStarted(nm *v1alpha1.NodeMaintenance, nodes int) event.Event {
	return event.Event{Regarding: nm, Type: corev1.EventTypeNormal, Reason: v1alpha1.ReasonStageStarted, Action: string(nm.Spec.Stage),
		Note: fmt.Sprintf("Stage %s started on %d node(s)", nm.Spec.Stage, nodes)}
}

func waitingForDrainSlot(nm *v1alpha1.NodeMaintenance, why string) event.Event {
	return event.Event{Regarding: nm, Type: corev1.EventTypeNormal, Reason: v1alpha1.ReasonWaitingForDrainSlot, Action: "Drain", Note: why}
}

func fastForwarded(nm *v1alpha1.NodeMaintenance, node, drainMessage string) event.Event {
	return event.Event{Regarding: nm, Type: corev1.EventTypeWarning, Reason: v1alpha1.ReasonFastForwarded, Action: "Drain",
		Note: fmt.Sprintf("Node %s: %s; pods this plan would have kept until later may already be gone", node, drainMessage)}
}

func drained(nm *v1alpha1.NodeMaintenance, nodes int) event.Event {
	return event.Event{Regarding: nm, Type: corev1.EventTypeNormal, Reason: v1alpha1.ReasonDrained, Action: "Drain",
		Note: fmt.Sprintf("Every targeted pod left the %d selected node(s)", nodes)}
}

func loadBalancersNotDown(nm *v1alpha1.NodeMaintenance, node string, gate time.Duration) event.Event {
	return event.Event{Regarding: nm, Type: corev1.EventTypeWarning, Reason: v1alpha1.ReasonLoadBalancersNotDown, Action: "Drain",
		Note: fmt.Sprintf("Node %s: the load balancers did not report its backends Down within %s; evacuating anyway", node, gate)}
}

func trafficDrainTimeout(nm *v1alpha1.NodeMaintenance, node string, connections int64) event.Event {
	return event.Event{Regarding: nm, Type: corev1.EventTypeWarning, Reason: v1alpha1.ReasonTrafficDrainTimeout, Action: "Drain",
		Note: fmt.Sprintf("Node %s: %d established connection(s) still go through it after the traffic-drain timeout; counting it drained", node, connections)}
}

func drainPlanDefaulted(nm *v1alpha1.NodeMaintenance) event.Event {
	return event.Event{Regarding: nm, Type: corev1.EventTypeNormal, Reason: v1alpha1.ReasonDrainPlanDefaulted, Action: "Default",
		Note: fmt.Sprintf("No drain plan was given (admission did not default it): using the default plan of %d entries", len(nm.Spec.DrainPlan))}
}

func recordoned(nm *v1alpha1.NodeMaintenance, node *corev1.Node) event.Event {
	return event.Event{Regarding: nm, Related: node, Type: corev1.EventTypeWarning, Reason: v1alpha1.ReasonRecordoned, Action: "Cordon",
		Note: fmt.Sprintf("Node %s was made schedulable during maintenance %s; cordoned it again", node.Name, nm.Name)}
}

func nodeReleased(nm *v1alpha1.NodeMaintenance, node *corev1.Node) event.Event {
	return event.Event{Regarding: nm, Related: node, Type: corev1.EventTypeNormal, Reason: v1alpha1.ReasonNodeReleased, Action: "Complete",
		Note: fmt.Sprintf("Released node %s from maintenance %s", node.Name, nm.Name)}
}
