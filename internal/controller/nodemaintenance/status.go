package nodemaintenance

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/event"
)

// updateStatus records the stage started, each node's drain and the
// conditions, emits events for what changed, and writes the status only
// when it changed.
func (r *Reconciler) updateStatus(ctx context.Context, nm *v1alpha1.NodeMaintenance, w *world, drain *drainResult) error {
	orig := nm.DeepCopy()
	waitMsg, waiting := w.waiting[nm.Name]
	r.recordStage(nm, w, waitMsg, waiting)
	st := &nm.Status
	st.NodeStatuses = r.nodeStatuses(nm, orig, w, drain, waitMsg, waiting)
	st.NodeCount = int32(len(st.NodeStatuses))
	if drain != nil && drain.self != nil {
		st.DrainPlanIndex = int32(drain.self.Index)
		r.Metrics.setPods(nm.Name, st.NodeStatuses)
	} else {
		// Not draining (another stage, or waiting for a slot): no pods
		// of its are being evacuated, and a gauge left at its last drain's
		// value would read as a drain that stopped moving.
		r.Metrics.forget(nm.Name)
	}
	r.setDrained(nm, drain, waitMsg, waiting)
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ReconciledCondition, Status: metav1.ConditionTrue, Reason: "Succeeded",
		Message: "the controller's last pass over this maintenance succeeded", ObservedGeneration: nm.Generation})
	if apiequality.Semantic.DeepEqual(orig.Status, nm.Status) {
		return nil
	}
	if err := r.Client.Status().Update(ctx, nm); err != nil {
		return fmt.Errorf("updating the status of %s: %w", nm.Name, err)
	}
	return nil
}

// recordStage appends the stage when it changes, with its start time (none
// yet for a Drain waiting for a slot: the drain, and the traffic-drain
// gate, count from when it gets one), and observes the previous stage's
// duration.
func (r *Reconciler) recordStage(nm *v1alpha1.NodeMaintenance, w *world, waitMsg string, waiting bool) {
	now := metav1.NewTime(r.Clock.Now())
	st := &nm.Status
	started := func(s *v1alpha1.StageStatus) {
		s.StartTimestamp = &now
		event.Publish(r.Recorder, stageStarted(nm, len(w.selected[nm.Name])))
	}
	if n := len(st.StageStatuses); n == 0 || st.StageStatuses[n-1].Name != nm.Spec.Stage {
		if n > 0 && st.StageStatuses[n-1].StartTimestamp != nil {
			r.Metrics.stageSeconds.WithLabelValues(string(st.StageStatuses[n-1].Name)).Observe(now.Sub(st.StageStatuses[n-1].StartTimestamp.Time).Seconds())
		}
		st.StageStatuses = append(st.StageStatuses, v1alpha1.StageStatus{Name: nm.Spec.Stage})
		if waiting {
			event.Publish(r.Recorder, waitingForDrainSlot(nm, waitMsg))
		} else {
			started(&st.StageStatuses[n])
		}
	} else if st.StageStatuses[n-1].StartTimestamp == nil && !waiting {
		started(&st.StageStatuses[n-1])
	}
}

// nodeStatuses builds each selected node's status from the drain.
func (r *Reconciler) nodeStatuses(nm, orig *v1alpha1.NodeMaintenance, w *world, drain *drainResult, waitMsg string, waiting bool) []v1alpha1.NodeMaintenanceNodeStatus {
	var statuses []v1alpha1.NodeMaintenanceNodeStatus
	for _, name := range w.selected[nm.Name] {
		ns := v1alpha1.NodeMaintenanceNodeStatus{NodeRef: v1alpha1.NodeReference{Name: name}}
		if waiting {
			ns.DrainMessage = waitMsg
		}
		if drain != nil && drain.self != nil {
			d := drain.nodes[name]
			ns.DrainTargets = drain.res.nodes[name].Targets
			ns.DrainPlanIndex = ptr.To(int32(drain.self.at(name)))
			ns.DrainMessage = drain.res.message(drain.self, name)
			ns.PodsPendingEvacuation, ns.PodsEvacuating = int32(d.pending), int32(d.evacuating)
			ns.PodsTotal = ns.PodsPendingEvacuation + ns.PodsEvacuating
			if old := oldNodeStatus(orig, name); old != nil {
				ns.PodsTotal = max(ns.PodsTotal, old.PodsTotal)
			}
			ns.TrafficDrainStartTime, ns.EstablishedConnections = d.trafficStart, d.connections
			ns.Drained = drain.nodeDrained(name)
			if ns.DrainMessage == "Drained" || ns.DrainMessage == "Evacuating" && drain.res.remaining[name] == 0 || !d.lbDown {
				if m := trafficMessage(d); m != "" {
					ns.DrainMessage = m
				}
			}
			r.reportTraffic(orig, name, d)
			if len(d.tolerating) > 0 {
				sort.Strings(d.tolerating)
				ns.DrainMessage += fmt.Sprintf("; DaemonSet(s) %s tolerate the draining taint: their pods would come back if evicted, so they stay (remove the toleration to drain them)", strings.Join(d.tolerating, ", "))
			}
			if d.static > 0 {
				ns.DrainMessage += fmt.Sprintf("; %d static pod(s) cannot be evacuated through the API: stop them on the node", d.static)
			}
			// Once per node when it becomes fast-forwarded, also on the
			// maintenance's first status (the KEP's maintenance-c case).
			if old := oldNodeStatus(orig, name); (old == nil || !isFastForward(old.DrainMessage)) && isFastForward(ns.DrainMessage) {
				event.Publish(r.Recorder, fastForwarded(nm, name, ns.DrainMessage))
			}
		}
		statuses = append(statuses, ns)
	}
	return statuses
}

// setDrained sets the Drained condition for the stage and the drain.
func (r *Reconciler) setDrained(nm *v1alpha1.NodeMaintenance, drain *drainResult, waitMsg string, waiting bool) {
	st := &nm.Status
	switch {
	case nm.Spec.Stage == v1alpha1.Drain && drain.drained():
		if !meta.IsStatusConditionTrue(st.Conditions, v1alpha1.DrainedCondition) {
			event.Publish(r.Recorder, drained(nm, len(st.NodeStatuses)))
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.DrainedCondition, Status: metav1.ConditionTrue, Reason: "PodsEvacuated",
			Message: "every targeted pod on every selected node has terminated and the load balancers carry no more traffic through them", ObservedGeneration: nm.Generation})
	case waiting:
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.DrainedCondition, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonWaitingForDrainSlot,
			Message: waitMsg, ObservedGeneration: nm.Generation})
	case nm.Spec.Stage == v1alpha1.Drain:
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.DrainedCondition, Status: metav1.ConditionFalse, Reason: "Evacuating",
			Message: "pods are being evacuated", ObservedGeneration: nm.Generation})
	case nm.Spec.Stage == v1alpha1.Complete:
		// Drained keeps its last value: it says whether the drain finished.
	default:
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.DrainedCondition, Status: metav1.ConditionFalse, Reason: "NotDraining",
			Message: fmt.Sprintf("stage %s does not drain", nm.Spec.Stage), ObservedGeneration: nm.Generation})
	}
}

func oldNodeStatus(nm *v1alpha1.NodeMaintenance, node string) *v1alpha1.NodeMaintenanceNodeStatus {
	i := slices.IndexFunc(nm.Status.NodeStatuses, func(s v1alpha1.NodeMaintenanceNodeStatus) bool { return s.NodeRef.Name == node })
	if i < 0 {
		return nil
	}
	return &nm.Status.NodeStatuses[i]
}

func isFastForward(msg string) bool { return strings.Contains(msg, "fast-forwarded") }
