package lbsync

import (
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/event"
)

// Event reasons on a Service whose frontend this replica cannot serve, and
// once it can again.
const (
	ReasonFrontendNotServed = "FrontendNotServed"
	ReasonFrontendServed    = "FrontendServed"
)

// Retry bounds for frontends that could not be served: their cause (a port
// held by another process, a missing address family) may go away without
// any change in the cluster, and the user waits for the retry then. A
// retry is one Apply, cheap even with a thousand Services.
const (
	skippedRetryFirst = time.Second
	skippedRetryMax   = 10 * time.Second
)

// skipReporter tells a Service's owner, once per change, which of its
// frontends this replica cannot serve and why, and when it serves them
// again. Only Run's goroutine uses it.
type skipReporter struct {
	recorder events.EventRecorder
	// reported is the message last reported per frontend name.
	reported map[string]string
	// services maps the last configuration's frontend names to their
	// Services.
	services map[string]*corev1.Service
	// backoff is the last retry interval, retryAt when that retry is
	// due: syncs that other events cause before then keep the schedule,
	// so that a burst of unrelated changes does not stretch the retry.
	backoff time.Duration
	retryAt time.Time
	clock   clock.PassiveClock
}

func newSkipReporter(recorder events.EventRecorder, clk clock.PassiveClock) *skipReporter {
	return &skipReporter{recorder: recorder, reported: map[string]string{}, services: map[string]*corev1.Service{}, clock: clk}
}

// expect records which Service each frontend of the next apply belongs to.
func (r *skipReporter) expect(services map[string]*corev1.Service) {
	r.services = services
}

// report logs and records the frontends the apply skipped and those not
// applied at all (refused: an address outside the pools), and the recovery
// of those skipped or refused before. It returns how soon to retry: zero
// when the apply skipped nothing (a refused frontend waits for a change of
// its Service or of the pools, and does not stretch the retries of the
// others).
func (r *skipReporter) report(log logr.Logger, skipped, refused []dataplane.SkippedFrontend) time.Duration {
	now := map[string]string{}
	for _, s := range slices.Concat(skipped, refused) {
		msg := fmt.Sprintf("ebb lb cannot serve frontend %s (%s): %v; its other frontends and every other Service are served", s.Name, s.Reason, s.Err)
		now[s.Name] = msg
		if r.reported[s.Name] == msg {
			continue
		}
		svc := r.services[s.Name]
		log.Info("Cannot serve a frontend; serving the others", "frontend", s.Name, "service", klog.KObj(svc), "reason", s.Reason, "err", s.Err.Error())
		if r.recorder != nil && svc != nil {
			event.Publish(r.recorder, frontendNotServed(svc, msg))
		}
	}
	for name := range r.reported {
		if _, still := now[name]; still {
			continue
		}
		svc, exists := r.services[name]
		if !exists {
			continue // the frontend is gone, not served
		}
		log.Info("Serving a frontend that could not be served before", "frontend", name, "service", klog.KObj(svc))
		if r.recorder != nil {
			event.Publish(r.recorder, frontendServed(svc, name))
		}
	}
	r.reported = now
	if len(skipped) == 0 {
		r.backoff, r.retryAt = 0, time.Time{}
		return 0
	}
	at := r.clock.Now()
	if at.Before(r.retryAt) {
		return r.retryAt.Sub(at)
	}
	r.backoff = min(max(2*r.backoff, skippedRetryFirst), skippedRetryMax)
	r.retryAt = at.Add(r.backoff)
	return r.backoff
}
