package podrunner

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// writeStatuses writes the pod's status whenever it differs from what the
// containers are doing, until ctx is done.
func (p *podRun) writeStatuses(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.statusDue:
		}
		if err := p.writeStatus(ctx); err != nil && ctx.Err() == nil {
			p.log.V(2).Info("Writing pod status", "err", err.Error())
			// Try again soon: the next change or this retry.
			time.AfterFunc(time.Second, p.statusChanged)
		}
	}
}

func (p *podRun) writeStatus(ctx context.Context) error {
	pods := p.r.opts.Client.CoreV1().Pods(p.current().Namespace)
	for range 5 {
		pod := p.current()
		if pod.DeletionTimestamp != nil {
			return nil // kwok finishes the deletion; nothing to report
		}
		want := p.desired(pod)
		if statusMatches(&pod.Status, want) {
			return nil
		}
		updated := pod.DeepCopy()
		updated.Status = *want
		_, err := pods.UpdateStatus(ctx, updated, metav1.UpdateOptions{})
		if err == nil {
			return nil // the informer brings the new version
		}
		if !apierrors.IsConflict(err) {
			return err
		}
		fresh, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if fresh.UID != pod.UID {
			return nil
		}
		p.mu.Lock()
		p.pod = fresh
		p.mu.Unlock()
	}
	return nil
}

// desired is the pod's status as its containers are.
func (p *podRun) desired(pod *corev1.Pod) *corev1.PodStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := pod.Status.DeepCopy()
	s.Phase = corev1.PodRunning
	if s.StartTime == nil {
		now := metav1.Now()
		s.StartTime = &now
	}
	allReady := true
	s.ContainerStatuses = nil
	for _, c := range p.containers {
		cs := corev1.ContainerStatus{Name: c.name, Image: c.image, ImageID: c.imageID, Ready: c.ready, RestartCount: c.restarts}
		started := c.running
		cs.Started = &started
		if c.running {
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: c.startedAt}
		} else {
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: c.waiting, Message: c.waitingMessage}
		}
		if c.last != nil {
			cs.LastTerminationState.Terminated = c.last
		}
		allReady = allReady && c.ready
		s.ContainerStatuses = append(s.ContainerStatuses, cs)
	}
	ready := corev1.ConditionFalse
	if allReady {
		ready = corev1.ConditionTrue
	}
	setCondition(s, corev1.ContainersReady, ready)
	setCondition(s, corev1.PodReady, ready)
	return s
}

// setCondition sets a condition's status, moving its transition time only
// when the status changes.
func setCondition(s *corev1.PodStatus, t corev1.PodConditionType, status corev1.ConditionStatus) {
	for i := range s.Conditions {
		if s.Conditions[i].Type == t {
			if s.Conditions[i].Status != status {
				s.Conditions[i].Status = status
				s.Conditions[i].LastTransitionTime = metav1.Now()
				s.Conditions[i].Reason, s.Conditions[i].Message = "", ""
			}
			return
		}
	}
	s.Conditions = append(s.Conditions, corev1.PodCondition{Type: t, Status: status, LastTransitionTime: metav1.Now()})
}

// statusMatches compares what matters: the phase, readiness, and each
// container's state, readiness and restarts.
func statusMatches(got, want *corev1.PodStatus) bool {
	if got.Phase != want.Phase || len(got.ContainerStatuses) != len(want.ContainerStatuses) {
		return false
	}
	for _, t := range []corev1.PodConditionType{corev1.PodReady, corev1.ContainersReady} {
		if conditionStatus(got, t) != conditionStatus(want, t) {
			return false
		}
	}
	for i, g := range got.ContainerStatuses {
		w := want.ContainerStatuses[i]
		if g.Name != w.Name || g.Ready != w.Ready || g.RestartCount != w.RestartCount ||
			(g.State.Running == nil) != (w.State.Running == nil) ||
			(g.State.Running != nil && !g.State.Running.StartedAt.Equal(&w.State.Running.StartedAt)) ||
			(g.State.Waiting != nil && w.State.Waiting != nil && g.State.Waiting.Reason != w.State.Waiting.Reason) {
			return false
		}
	}
	return true
}

func conditionStatus(s *corev1.PodStatus, t corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range s.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}
