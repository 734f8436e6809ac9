package lbsync

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// Event reasons on a pod-mode Service none of whose pods this replica can
// reach, and once it can again.
const (
	ReasonPodBackendsUnreachable = "PodBackendsUnreachable"
	ReasonPodBackendsReachable   = "PodBackendsReachable"
)

// unreachableCheck is how often the probes' verdicts are looked at.
const unreachableCheck = 5 * time.Second

// unreachableReporter tells the owner of a pod-mode Service (KEP-1864:
// traffic straight to the pods) when this replica reaches none of its
// pods: every pod backend has failed its probes. That is what a pod
// network the LB hosts are not part of looks like (or a targetPort nothing
// listens on), and without the event it shows only as refused connections
// and probe metrics. Once per change, like skipReporter.
type unreachableReporter struct {
	recorder events.EventRecorder

	mu sync.Mutex
	// services are the pod-mode Services of the last configuration, with
	// their probed backends by frontend name.
	services map[string]podService
	// reported are the Services last reported unreachable.
	reported map[string]bool
}

type podService struct {
	svc      *corev1.Service
	backends []backendRef
}

func newUnreachableReporter(recorder events.EventRecorder) *unreachableReporter {
	return &unreachableReporter{recorder: recorder, services: map[string]podService{}, reported: map[string]bool{}}
}

// expect records the pod-mode Services of the configuration just applied.
func (r *unreachableReporter) expect(cfg dataplane.Config, owners map[string]*corev1.Service) {
	services := map[string]podService{}
	for _, fe := range cfg.Frontends {
		svc := owners[fe.Name]
		if svc == nil || fe.HealthCheck == nil || lbmodel.ModeOf(svc) != lbmodel.PodMode {
			continue // node mode, or not probed: nothing to tell
		}
		key := svc.Namespace + "/" + svc.Name
		ps := services[key]
		ps.svc = svc
		for _, b := range fe.Backends {
			ps.backends = append(ps.backends, backendRef{fe.Name, b.AddrPort()})
		}
		services[key] = ps
	}
	r.mu.Lock()
	r.services = services
	r.mu.Unlock()
}

// check compares the data plane's backends with what was last reported.
func (r *unreachableReporter) check(log logr.Logger, status []dataplane.BackendStatus) {
	healthy := backendsWhere(status, func(b dataplane.BackendStatus) bool { return b.Healthy })
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]string, 0, len(r.services))
	for key := range r.services {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	now := map[string]bool{}
	for _, key := range keys {
		ps := r.services[key]
		total, up := len(ps.backends), 0
		for _, b := range ps.backends {
			if healthy[b] {
				up++
			}
		}
		switch {
		case total > 0 && up == 0:
			now[key] = true
			if r.reported[key] {
				continue
			}
			log.Info("No pod of a pod-mode Service answers this replica's probes", "service", klog.KObj(ps.svc), "backends", total)
			if r.recorder != nil {
				event.Publish(r.recorder, podBackendsUnreachable(ps.svc, total))
			}
		case r.reported[key]:
			log.Info("A pod-mode Service's pods answer this replica's probes again", "service", klog.KObj(ps.svc))
			if r.recorder != nil {
				event.Publish(r.recorder, podBackendsReachable(ps.svc, up, total))
			}
		}
	}
	r.reported = now
}

// run checks every unreachableCheck until ctx is done: probes change
// without any change in the cluster.
func (r *unreachableReporter) run(ctx context.Context, log logr.Logger, status func() []dataplane.BackendStatus) {
	t := time.NewTicker(unreachableCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.check(log, status())
		}
	}
}
