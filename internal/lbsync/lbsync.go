// Package lbsync keeps a data plane serving the cluster's Services: it
// watches Services of its class, their EndpointSlices and the Nodes,
// computes every frontend with lbmodel and applies the whole configuration
// atomically whenever something changes. Several `ebb lb` replicas compute
// the same configuration from the same objects.
package lbsync

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/ebbdev/ebb/internal/dataplane"
	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// +kubebuilder:rbac:groups="",resources=services;nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch

// resync recomputes everything periodically, so anything missed heals.
const resync = 5 * time.Minute

// The sync is one work item: every event adds it (added many times before
// it runs, it runs once), a failure adds it back with exponential backoff
// from 50 ms to 30 s, and a sync that knows when it must look again (a
// skipped frontend, a mode switch's overlap) adds it after that long.
const (
	syncKey         = "sync"
	syncBackoffBase = 50 * time.Millisecond
	syncBackoffMax  = 30 * time.Second
	// addressRetry is how soon addresses that could not be made local or
	// announced are tried again.
	addressRetry = time.Second
)

// A Service that switches between node and pod mode keeps its old
// backends next to the new ones (make before break) until the new path is
// known to work: every frontend has a new backend whose probe has
// succeeded and that is eligible, and at least modeSwitchMinOverlap has
// passed. The probe proves most in pod mode (a TCP connect to the endpoint
// itself); in node mode it is the node's health port (kube-proxy's
// /healthz), which says the node is healthy but not that kube-proxy has
// opened the new node port yet, which the minimum covers. While it waits,
// a dial that fails moves on to another backend, old ones included.
// modeSwitchMaxOverlap bounds the wait: a new mode that never works must
// not keep old backends that may be gone for good (node ports
// deallocated); its probes then say why. The overlap is re-checked every
// modeSwitchCheck.
const (
	modeSwitchMinOverlap = 5 * time.Second
	modeSwitchMaxOverlap = 60 * time.Second
	modeSwitchCheck      = 250 * time.Millisecond
)

// transition is a Service's switch between backend modes.
type transition struct {
	old   map[string][]dataplane.Backend // frontend name -> backends before
	since time.Time
}

// Syncer drives a data plane from the cluster.
type Syncer struct {
	Client    kubernetes.Interface
	DataPlane *dataplane.DataPlane
	// Class is the loadBalancerClass served; DefaultLoadBalancer also
	// serves Services without a class.
	Class               string
	DefaultLoadBalancer bool
	Model               lbmodel.Options
	// Registerer takes the sync metrics; nil: not registered.
	Registerer prometheus.Registerer
	// Recorder reports admin-state changes this replica could not apply
	// as Node events, and frontends it cannot serve as Service events;
	// nil: none.
	Recorder events.EventRecorder
	// Addresses, if set, is told the addresses of the frontends being
	// served after every apply, so the host accepts their traffic
	// (vipaddr.Table).
	Addresses interface{ Sync([]netip.Addr) error }
	// HostNode is the node this replica runs on. OnHostLeaving, if set, is
	// told each time that node starts or stops leaving (a leaving taint,
	// lbmodel.IsLeaving, or the Node deleted), with the reason, so the
	// replica drains itself before anyone evicts it.
	HostNode      string
	OnHostLeaving func(leaving bool, reason string)
	// CutOff, if set, says whether this replica has lost the API server
	// (Reporter.CutOff), checked every second. While it holds, and for
	// CutOffHold after, HostNode's own kube-proxy is probably as stale as
	// this replica's caches: see spareOwnNode.
	CutOff     func() bool
	CutOffHold time.Duration
	// blind: the replica counts itself cut off (watchCutOff).
	blind atomic.Bool

	ready atomic.Bool
	// hostLeaving is the last value given OnHostLeaving; only the node
	// informer's handler uses it.
	hostLeaving *bool
	queue       workqueue.TypedRateLimitingInterface[string]

	// Only Run's goroutine uses these.
	skips       *skipReporter
	unannounced *unannouncedReporter
	unreachable *unreachableReporter
	modes       map[string]lbmodel.BackendMode
	last        map[string][]dataplane.Frontend
	transitions map[string]transition
	now         func() time.Time
	// status reads the data plane's backends (DataPlane.Status; a fake in
	// tests): the overlap of a mode switch ends on it.
	status func() []dataplane.BackendStatus
	// pools are the addresses that may be served (SetPools), from another
	// goroutine, which kicks a sync once running says the queue is set.
	pools   poolRanges
	running atomic.Bool
}

// Ready reports whether the caches have synced and a configuration has
// been applied.
func (s *Syncer) Ready() bool { return s.ready.Load() }

// Run syncs until ctx is done.
func (s *Syncer) Run(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("lbsync")
	s.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](syncBackoffBase, syncBackoffMax),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "lbsync"})
	defer s.queue.ShutDown()
	s.running.Store(true) // after the queue is set: SetPools may kick from now on
	s.modes, s.last, s.transitions = map[string]lbmodel.BackendMode{}, map[string][]dataplane.Frontend{}, map[string]transition{}
	s.skips = newSkipReporter(s.Recorder, clock.RealClock{})
	s.unannounced = &unannouncedReporter{recorder: s.Recorder, node: s.HostNode}
	s.unreachable = newUnreachableReporter(s.Recorder)
	if s.now == nil {
		s.now = time.Now
	}
	if s.status == nil {
		s.status = s.DataPlane.Status
	}
	metrics := newSyncMetrics()
	fast := newAdminFastPath(s.DataPlane, s.Model, s.Recorder)
	if s.Registerer != nil {
		for _, c := range append(metrics.collectors(), fast.collectors()...) {
			if err := s.Registerer.Register(c); err != nil {
				return fmt.Errorf("registering sync metrics: %w", err)
			}
		}
	}
	factory := informers.NewSharedInformerFactory(s.Client, resync)
	services := factory.Core().V1().Services()
	slices := factory.Discovery().V1().EndpointSlices()
	nodes := factory.Core().V1().Nodes()
	if err := s.watch(services.Informer(), slices.Informer(), nodes.Informer(), fast); err != nil {
		return err
	}
	go fast.run(ctx, log.WithName("adminstate"))
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("caches of %v did not sync", typ)
		}
	}
	s.kick()
	go s.unreachable.run(ctx, log, s.status)
	if s.CutOff != nil && s.HostNode != "" {
		go s.watchCutOff(ctx, log, metrics.cutOff)
	}
	go func() {
		<-ctx.Done()
		s.queue.ShutDown()
	}()
	for {
		key, shutdown := s.queue.Get()
		if shutdown {
			return nil
		}
		next, err := s.sync(log, services.Lister(), slices.Lister(), nodes.Lister(), metrics)
		switch {
		case err != nil:
			s.queue.AddRateLimited(key)
		case next > 0:
			s.queue.Forget(key)
			s.queue.AddAfter(key, next)
		default:
			s.queue.Forget(key)
		}
		s.queue.Done(key)
	}
}

// watch syncs on every change of Services and EndpointSlices, and feeds
// node changes to the admin-state fast path first, then to the full sync.
func (s *Syncer) watch(services, slices, nodes cache.SharedIndexInformer, fast *adminFastPath) error {
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.kick() },
		UpdateFunc: func(any, any) { s.kick() },
		DeleteFunc: func(any) { s.kick() },
	}
	for _, inf := range []cache.SharedIndexInformer{services, slices} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("watching the cluster: %w", err)
		}
	}
	// Nodes feed the admin-state fast path first, then the full sync.
	_, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if n, ok := obj.(*corev1.Node); ok {
				fast.observe(n)
				s.observeHost(n, false)
			}
			s.kick()
		},
		UpdateFunc: func(_, obj any) {
			if n, ok := obj.(*corev1.Node); ok {
				fast.observe(n)
				s.observeHost(n, false)
			}
			s.kick()
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				fast.forget(n)
				s.observeHost(n, true)
			}
			s.kick()
		},
	})
	if err != nil {
		return fmt.Errorf("watching nodes: %w", err)
	}
	return nil
}

// observeHost tells OnHostLeaving when this replica's own node starts or
// stops leaving.
func (s *Syncer) observeHost(n *corev1.Node, deleted bool) {
	if s.OnHostLeaving == nil || s.HostNode == "" || n.Name != s.HostNode {
		return
	}
	leaving, reason := lbmodel.IsLeaving(n, s.Model)
	if deleted {
		leaving, reason = true, "the Node was deleted"
	} else if leaving {
		reason = "taint " + reason
	}
	if s.hostLeaving != nil && *s.hostLeaving == leaving {
		return
	}
	wasLeaving := s.hostLeaving != nil && *s.hostLeaving
	s.hostLeaving = &leaving
	s.OnHostLeaving(leaving, reason)
	if s.Recorder == nil {
		return
	}
	switch {
	case leaving:
		event.Publish(s.Recorder, hostDraining(n, reason, s.DataPlane.Connections()))
	case wasLeaving:
		event.Publish(s.Recorder, hostServing(n))
	}
}

// sync computes the whole configuration from the caches and applies it;
// it returns when it must run again without an event (0: only on one).
func (s *Syncer) sync(log logr.Logger, services corelisters.ServiceLister, slices discoverylisters.EndpointSliceLister, nodes corelisters.NodeLister, m syncMetrics) (time.Duration, error) {
	start := time.Now()
	cfg, owners, refused := s.desired(log, services, slices, nodes)
	s.skips.expect(owners)
	res, err := s.DataPlane.Apply(cfg)
	if err != nil {
		log.Error(err, "Applying the load balancer configuration; retrying with backoff", "frontends", len(cfg.Frontends))
		return 0, err
	}
	m.seconds.Observe(time.Since(start).Seconds())
	next := s.skips.report(log, res.Skipped, refused)
	s.unreachable.expect(cfg, owners)
	if s.Addresses != nil {
		if err := s.Addresses.Sync(s.DataPlane.Addresses()); err != nil {
			log.Error(err, "Making the load balancer's addresses local to this host, or announcing them; retrying")
			next = addressRetry
		}
		if u, ok := s.Addresses.(Unannouncer); ok {
			now := u.Unannounced()
			m.unannounced.Set(float64(len(now)))
			s.unannounced.report(log, now, cfg, owners)
		}
	}
	if at, ok := s.nextTransitionCheck(); ok && (next == 0 || time.Until(at) < next) {
		next = max(time.Until(at), time.Millisecond)
	}
	m.frontends.Set(float64(len(cfg.Frontends) - len(res.Skipped)))
	s.ready.Store(true)
	log.V(4).Info("Applied the load balancer configuration", "frontends", len(cfg.Frontends), "skipped", len(res.Skipped))
	return next, nil
}

// kick asks for a sync.
func (s *Syncer) kick() { s.queue.Add(syncKey) }

// serves reports whether a Service is one this load balancer serves.
func (s *Syncer) serves(svc *corev1.Service) bool {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.DeletionTimestamp != nil {
		return false
	}
	if svc.Spec.LoadBalancerClass == nil {
		return s.DefaultLoadBalancer
	}
	return *svc.Spec.LoadBalancerClass == s.Class
}

// desired computes the whole configuration from the caches, the Service
// of each frontend by name, and the frontends refused because their
// address lies in no pool.
func (s *Syncer) desired(log logr.Logger, services corelisters.ServiceLister, slices discoverylisters.EndpointSliceLister, nodeLister corelisters.NodeLister) (dataplane.Config, map[string]*corev1.Service, []dataplane.SkippedFrontend) {
	// Listing from an informer's cache cannot fail.
	svcs, _ := services.List(labels.Everything())
	nodes, _ := nodeLister.List(labels.Everything())
	allSlices, _ := slices.List(labels.Everything())
	byService := map[string][]*discoveryv1.EndpointSlice{}
	for _, sl := range allSlices {
		if name := sl.Labels[discoveryv1.LabelServiceName]; name != "" {
			key := sl.Namespace + "/" + name
			byService[key] = append(byService[key], sl)
		}
	}
	sort.Slice(svcs, func(i, j int) bool { return svcs[i].Namespace+"/"+svcs[i].Name < svcs[j].Namespace+"/"+svcs[j].Name })
	var cfg dataplane.Config
	var refused []dataplane.SkippedFrontend
	working := sync.OnceValue(func() map[backendRef]bool { return backendsWhere(s.status(), provenWorking) })
	seen := map[string]bool{}
	owners := map[string]*corev1.Service{}
	blind := s.blind.Load() && s.HostNode != "" && !s.Model.AdminStateDisabled
	for _, svc := range svcs {
		if !s.serves(svc) {
			continue
		}
		key := svc.Namespace + "/" + svc.Name
		fes, err := lbmodel.Frontends(svc, byService[key], nodes, s.Model)
		if err != nil {
			log.V(2).Info("Serving only part of a Service", "service", klog.KObj(svc), "reason", err.Error())
		}
		if blind {
			spareOwnNode(svc, fes, s.HostNode, working)
		}
		inPools := fes[:0:0]
		for _, fe := range fes {
			if s.pools.admits(fe.Address) {
				inPools = append(inPools, fe)
				continue
			}
			refused = append(refused, dataplane.SkippedFrontend{Name: fe.Name, Reason: SkipOutsidePools, Err: outsidePools(fe.Address)})
			owners[fe.Name] = svc
		}
		for _, fe := range s.overlap(log, svc, key, inPools, working) {
			cfg.Frontends = append(cfg.Frontends, fe)
			owners[fe.Name] = svc
		}
		seen[key] = true
	}
	for key := range s.modes {
		if !seen[key] {
			delete(s.modes, key)
			delete(s.last, key)
			delete(s.transitions, key)
		}
	}
	return cfg, owners, refused
}

// overlap records a Service's frontends and, while it switches between
// backend modes, adds its previous backends to the new ones. working
// returns the backends the data plane has proven (read once per sync, and
// only if a switch needs it).
func (s *Syncer) overlap(log logr.Logger, svc *corev1.Service, key string, fes []dataplane.Frontend, working func() map[backendRef]bool) []dataplane.Frontend {
	mode := lbmodel.ModeOf(svc)
	if prev, ok := s.modes[key]; ok && prev != mode {
		old := map[string][]dataplane.Backend{}
		for _, fe := range s.last[key] {
			old[fe.Name] = fe.Backends
		}
		s.transitions[key] = transition{old: old, since: s.now()}
		log.Info("Service switches backend mode; keeping the old backends until a new one answers its probe", "service", klog.KObj(svc), "from", prev, "to", mode, "atMost", modeSwitchMaxOverlap)
	}
	s.modes[key], s.last[key] = mode, fes
	t, ok := s.transitions[key]
	if !ok {
		return fes
	}
	elapsed := s.now().Sub(t.since)
	if works := elapsed >= modeSwitchMinOverlap && newPathWorks(fes, working()); works || elapsed >= modeSwitchMaxOverlap {
		delete(s.transitions, key)
		if !works {
			log.Info("Service's new backend mode has no backend that answered its probe; dropping the old backends anyway", "service", klog.KObj(svc), "mode", mode, "after", modeSwitchMaxOverlap)
		}
		return fes
	}
	out := make([]dataplane.Frontend, len(fes))
	for i, fe := range fes {
		have := map[string]bool{}
		for _, b := range fe.Backends {
			have[b.Address+":"+strconv.Itoa(int(b.Port))] = true
		}
		var old []dataplane.Backend
		for _, b := range t.old[fe.Name] {
			if !have[b.Address+":"+strconv.Itoa(int(b.Port))] {
				old = append(old, b)
			}
		}
		// Interleave new and old, so that a connection whose first dial
		// fails (the new path not ready yet) tries an old backend next.
		merged := make([]dataplane.Backend, 0, len(fe.Backends)+len(old))
		for j := 0; j < max(len(fe.Backends), len(old)); j++ {
			if j < len(fe.Backends) {
				merged = append(merged, fe.Backends[j])
			}
			if j < len(old) {
				merged = append(merged, old[j])
			}
		}
		fe.Backends = merged
		// The old and new modes probe differently; during the overlap the
		// new mode's health check applies to all.
		out[i] = fe
	}
	return out
}

// backendRef names one backend of one frontend in the data plane.
type backendRef struct {
	frontend string
	addr     netip.AddrPort
}

// backendsWhere indexes the backends of status for which keep holds.
func backendsWhere(status []dataplane.BackendStatus, keep func(dataplane.BackendStatus) bool) map[backendRef]bool {
	out := map[backendRef]bool{}
	for _, b := range status {
		if keep(b) {
			out[backendRef{b.Frontend, b.Address}] = true
		}
	}
	return out
}

// provenWorking: a probe has succeeded on the backend, and it is healthy
// and eligible.
func provenWorking(b dataplane.BackendStatus) bool { return b.Confirmed && b.Healthy && b.Eligible }

// newPathWorks reports whether every frontend has a new backend among
// working (the data plane has reached it: provenWorking). A frontend
// without backends has nothing to wait for.
func newPathWorks(fes []dataplane.Frontend, working map[backendRef]bool) bool {
	for _, fe := range fes {
		if len(fe.Backends) == 0 {
			continue
		}
		ok := false
		for _, b := range fe.Backends {
			if working[backendRef{fe.Name, b.AddrPort()}] {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// nextTransitionCheck returns when an overlap must be looked at again:
// at its minimum, then often until its new backends' probes end it (or
// the cap does).
func (s *Syncer) nextTransitionCheck() (time.Time, bool) {
	var next time.Time
	for _, t := range s.transitions {
		at := t.since.Add(modeSwitchMinOverlap)
		if now := s.now(); !now.Before(at) {
			at = minTime(now.Add(modeSwitchCheck), t.since.Add(modeSwitchMaxOverlap))
		}
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return next, !next.IsZero()
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
