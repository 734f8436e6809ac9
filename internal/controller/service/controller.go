// Package service is ebb's Service load-balancer controller (KEP-1959): it
// serves Services of type LoadBalancer whose loadBalancerClass is ebb's,
// guards them with the load-balancer-cleanup finalizer, allocates their
// addresses from pools and writes them to status. It never touches a
// Service of another class.
package service

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrlreconcile "sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	lbv1alpha1 "github.com/ebbdev/ebb/api/lb/v1alpha1"
	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/event"
	"github.com/ebbdev/ebb/internal/lbmodel"
)

// RequestedIPsAnnotation asks for specific addresses (comma-separated), the
// replacement for the deprecated spec.loadBalancerIP.
const RequestedIPsAnnotation = "lb.ebb.dev/load-balancer-ips"

// Event reasons, the upstream service controller's.
const (
	ReasonEnsuring   = "EnsuringLoadBalancer"
	ReasonEnsured    = "EnsuredLoadBalancer"
	ReasonSyncFailed = "SyncLoadBalancerFailed"
	ReasonDeleting   = "DeletingLoadBalancer"
	ReasonDeleted    = "DeletedLoadBalancer"
	// ReasonAddressPortCollision: a Service that shares its address
	// changed its ports to one another sharer uses.
	ReasonAddressPortCollision = "AddressPortCollision"
	// ReasonNodePortsKept: allocateLoadBalancerNodePorts is false but the
	// Service keeps its node ports (KEP-1864 keeps them on purpose), so
	// traffic still goes through them until they are removed.
	ReasonNodePortsKept = "NodePortsKept"
	// ReasonAddressFamilyUnavailable: a PreferDualStack Service is served
	// in fewer IP families than it has, for want of an address.
	ReasonAddressFamilyUnavailable = "AddressFamilyUnavailable"
	// ReasonClientAddressNotPreserved: an externalTrafficPolicy Local
	// Service whose backends will not see the client's address.
	ReasonClientAddressNotPreserved = "ClientAddressNotPreserved"
	// ReasonAddressConflict: the Service's status shows an address other
	// Services hold (two leaders gave it out at once, or someone wrote the
	// status): it gets another.
	ReasonAddressConflict = "AddressConflict"
)

// retryAfterBadRequest is when a Service whose request failed is looked at
// again: the cause (a pool full, an address taken) may clear.
const retryAfterBadRequest = 30 * time.Second

// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=services/status,verbs=get;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=lb.ebb.dev,resources=addresspools,verbs=get;list;watch
// +kubebuilder:rbac:groups=lb.ebb.dev,resources=addresspools/status,verbs=get;update;patch

// Reconciler reconciles Services of type LoadBalancer.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// Class is the loadBalancerClass served (lbmodel.ClassL4).
	Class string
	// DefaultLoadBalancer also serves Services without a class.
	DefaultLoadBalancer bool
	IPAM                *Allocator
	// Metrics may be nil.
	Metrics *Metrics
	// PublishAtOnce writes an allocated address to the status at once,
	// rather than once an LB host reports it served (for ebb lb replicas
	// that write no LoadBalancerReport).
	PublishAtOnce bool
	// Clock tells the reports' freshness (nil: the real clock).
	Clock clock.PassiveClock

	// released wakes the Services waiting for an address when one is
	// freed (nil until SetupWithManager: then nothing is woken).
	released chan ctrlevent.GenericEvent

	initOnce sync.Once
	initErr  error
}

// SetupWithManager registers the controller. A change of the address
// pools, or an address freed, wakes the Services that have no address
// yet, or not one of each family: the pool they wait for may have
// appeared or grown, or have room again. A change of
// a LoadBalancerReport wakes the Services whose addresses await an LB
// host.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	r.released = make(chan ctrlevent.GenericEvent, 1)
	return ctrl.NewControllerManagedBy(mgr).Named("service-lb").For(&corev1.Service{}).
		Watches(&lbv1alpha1.AddressPool{}, handler.EnqueueRequestsFromMapFunc(r.waitingServices)).
		Watches(&v1alpha1.LoadBalancerReport{}, handler.EnqueueRequestsFromMapFunc(r.awaitingServices)).
		WatchesRawSource(source.Channel(r.released, handler.EnqueueRequestsFromMapFunc(r.waitingServices))).
		Complete(r)
}

// waitingServices are the Services we should serve that have no address,
// or fewer than their IP families (PreferDualStack served in one).
func (r *Reconciler) waitingServices(ctx context.Context, _ client.Object) []ctrlreconcile.Request {
	return r.wantedServices(ctx, func(svc *corev1.Service) bool { return len(lbmodel.Addresses(svc)) < len(familiesOf(svc)) })
}

// wantedServices are requests for the Services we should serve for which
// match is true.
func (r *Reconciler) wantedServices(ctx context.Context, match func(*corev1.Service) bool) []ctrlreconcile.Request {
	var list corev1.ServiceList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil
	}
	var out []ctrlreconcile.Request
	for i := range list.Items {
		svc := &list.Items[i]
		if r.wants(svc) && match(svc) {
			out = append(out, ctrlreconcile.Request{NamespacedName: client.ObjectKeyFromObject(svc)})
		}
	}
	return out
}

// Reconcile brings one Service's load balancer to its desired state.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if err := r.initialize(ctx); err != nil {
		return ctrl.Result{}, err
	}
	svc := &corev1.Service{}
	if err := r.Client.Get(ctx, req.NamespacedName, svc); err != nil {
		if apierrors.IsNotFound(err) {
			r.release(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("getting service %s: %w", req, err)
	}
	if !r.wants(svc) {
		// Being deleted, or no longer a LoadBalancer (the apiserver then
		// clears the class): clean up what is ours. A Service of another
		// class is never touched.
		// Ours also when the mark says so: a Service that never got an
		// address, or whose clean-up failed half-way, holds none, and the
		// API server cleared its class when its type changed.
		owned := len(r.IPAM.Owned(req.NamespacedName)) > 0
		marked := svc.Annotations[lbmodel.ServedByAnnotation] == r.Class
		if controllerutil.ContainsFinalizer(svc, lbmodel.CleanupFinalizer) && (r.classMatches(svc) || owned || marked) {
			return ctrl.Result{}, r.reconcileDelete(ctx, svc)
		}
		return ctrl.Result{}, nil
	}
	return r.reconcileNormal(ctx, svc)
}

// classMatches reports whether the Service names our class (or none, when
// we are the default load balancer).
func (r *Reconciler) classMatches(svc *corev1.Service) bool {
	if svc.Spec.LoadBalancerClass == nil {
		return r.DefaultLoadBalancer
	}
	return *svc.Spec.LoadBalancerClass == r.Class
}

// served reports whether the Service is, or was, ours: of our class and a
// LoadBalancer, or marked as served by us and still holding the cleanup
// finalizer (a Service that stopped being a LoadBalancer lost its class).
// A class-less Service with the finalizer alone may be another
// implementation's: that finalizer is KEP-1959's, shared by all.
func (r *Reconciler) served(svc *corev1.Service) bool {
	if r.classMatches(svc) && svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		return true
	}
	return svc.Annotations[lbmodel.ServedByAnnotation] == r.Class && controllerutil.ContainsFinalizer(svc, lbmodel.CleanupFinalizer)
}

// wants reports whether the Service should have a load balancer from us.
func (r *Reconciler) wants(svc *corev1.Service) bool {
	return svc.DeletionTimestamp == nil && svc.Spec.Type == corev1.ServiceTypeLoadBalancer && r.classMatches(svc)
}

// initialize rebuilds the allocations from every Service's status once,
// before the first allocation, so an address is never given twice: the
// addresses published, and those awaiting an LB host.
func (r *Reconciler) initialize(ctx context.Context) error {
	r.initOnce.Do(func() {
		// The pools first: a Service that asks for an address before the
		// pool controller has read them would be refused.
		if err := r.loadPools(ctx); err != nil {
			r.initErr = err
			return
		}
		var list corev1.ServiceList
		if err := r.Client.List(ctx, &list); err != nil {
			r.initErr = fmt.Errorf("listing services to rebuild address allocations: %w", err)
			return
		}
		// Oldest first: of two Services that show one address and may not
		// share it, the older keeps it (Adopt), and the other gets a new
		// one at its reconcile, with a Warning.
		slices.SortFunc(list.Items, func(a, b corev1.Service) int {
			if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
				return c
			}
			return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
		})
		for i := range list.Items {
			svc := &list.Items[i]
			if !r.served(svc) {
				continue
			}
			for _, addr := range lbmodel.Addresses(svc) {
				r.IPAM.Adopt(addr, holderOf(svc, nil))
			}
		}
	})
	if r.initErr != nil {
		// Try again on the next reconcile.
		err := r.initErr
		r.initOnce, r.initErr = sync.Once{}, nil
		return err
	}
	return nil
}

func (r *Reconciler) reconcileNormal(ctx context.Context, svc *corev1.Service) (ctrl.Result, error) {
	logger := log.FromContext(ctx).WithValues("service", klog.KObj(svc))
	// The finalizer and the mark first, also for a Service refused below:
	// they make the clean-up (reconcileDelete) take its condition away
	// when it stops being ours.
	if !controllerutil.ContainsFinalizer(svc, lbmodel.CleanupFinalizer) || svc.Annotations[lbmodel.ServedByAnnotation] != r.Class {
		patch := client.MergeFrom(svc.DeepCopy())
		controllerutil.AddFinalizer(svc, lbmodel.CleanupFinalizer)
		if svc.Annotations == nil {
			svc.Annotations = map[string]string{}
		}
		svc.Annotations[lbmodel.ServedByAnnotation] = r.Class
		if err := r.Client.Patch(ctx, svc, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding finalizer to %s: %w", klog.KObj(svc), err)
		}
	}
	if err := unsupportedPorts(svc); err != nil {
		event.Publish(r.Recorder, syncFailed(svc, err))
		r.Metrics.failed("unsupported_protocol")
		msg := err.Error()
		if len(svc.Status.LoadBalancer.Ingress) > 0 {
			msg += "; the addresses it has keep serving its other ports until then"
		}
		// The Service must change first.
		return ctrl.Result{}, r.writeNotAssigned(ctx, svc, nil, notAssignedCondition(svc, ReasonUnsupportedPort, msg))
	}
	holder, err := r.holder(ctx, svc)
	if err != nil {
		return ctrl.Result{}, err
	}
	conflicts := r.reportConflicts(svc, holder)
	addrs, skipped, err := r.allocate(svc, holder)
	if err != nil {
		event.Publish(r.Recorder, allocationFailed(svc, err))
		logger.Info("Cannot allocate an address", "err", err.Error())
		r.Metrics.failed("allocation")
		// An address another Service holds leaves the status now, with or
		// without another to take its place: two Services must not be
		// served at one address while this one waits.
		cond := notAssignedCondition(svc, ReasonAllocationFailed, err.Error()+" (ebb tries again every 30 s and at each change of the Service or the pools)")
		if err := r.writeNotAssigned(ctx, svc, conflicts, cond); err != nil {
			return ctrl.Result{}, err
		}
		// The cause (a pool full, an address taken) may clear.
		return ctrl.Result{RequeueAfter: retryAfterBadRequest}, nil
	}
	var collisions []string
	for _, addr := range addrs {
		collisions = append(collisions, r.IPAM.Collisions(addr, holder)...)
	}
	if len(collisions) > 0 {
		event.Publish(r.Recorder, portCollision(svc, collisions))
	}
	if skipped != "" {
		event.Publish(r.Recorder, familyUnavailable(svc, skipped))
	}
	if keepsNodePorts(svc) {
		event.Publish(r.Recorder, nodePortsKept(svc))
	}
	switch pp, ok := svc.Annotations[lbmodel.ProxyProtocolAnnotation]; {
	case ok && pp != lbmodel.ProxyProtocolV2:
		event.Publish(r.Recorder, badProxyProtocol(svc, pp))
	case !ok && svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal:
		event.Publish(r.Recorder, clientAddressNotPreserved(svc))
	}
	published, awaiting, err := r.publication(ctx, svc, addrs)
	if err != nil {
		return ctrl.Result{}, err
	}
	result := ctrl.Result{}
	if len(awaiting) > 0 {
		result.RequeueAfter = awaitingRecheck
	}
	want, cond := ingressFor(svc, published), servedCondition(svc, awaiting)
	assigned := assignedCondition(svc, addrs, skipped)
	changed := !equalIngress(svc.Status.LoadBalancer.Ingress, want)
	// A Service published before ebb wrote a condition gets it with its
	// next change of status, not a write of its own: one status write per
	// Service at an upgrade would hold up the controller's queue for
	// minutes at 10,000 Services.
	noCondition := len(awaiting) == 0 && meta.FindStatusCondition(svc.Status.Conditions, lbmodel.ServedCondition) == nil
	assignedSays := hasCondition(svc.Status.Conditions, assigned) || meta.FindStatusCondition(svc.Status.Conditions, AddressAssignedCondition) == nil
	if !changed && (noCondition || hasCondition(svc.Status.Conditions, cond)) && assignedSays {
		return result, nil
	}
	if changed {
		event.Publish(r.Recorder, ensuring(svc))
	}
	// The optimistic lock: the patch replaces the whole list of
	// conditions, and one computed from a stale cache would drop another
	// writer's, or a condition of ours written meanwhile.
	patch := client.MergeFromWithOptions(svc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	svc.Status.LoadBalancer.Ingress = want
	meta.SetStatusCondition(&svc.Status.Conditions, cond)
	meta.SetStatusCondition(&svc.Status.Conditions, assigned)
	if err := r.Client.Status().Patch(ctx, svc, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("writing the load balancer status of %s: %w", klog.KObj(svc), err)
	}
	if len(awaiting) > 0 {
		logger.Info("Addresses allocated, awaiting an LB host to serve them", "addresses", joinAddrs(awaiting))
	}
	if changed && len(published) > 0 {
		event.Publish(r.Recorder, ensured(svc, published))
		logger.Info("Ensured load balancer", "addresses", joinAddrs(published))
	}
	return result, nil
}

// reconcileDelete clears the status of a Service that still exists as
// another type, removes the finalizer and ebb's mark, and only then
// releases its addresses. Each step is idempotent and a failure returns
// before the next, so a retry completes the sequence: the mark and the
// finalizer say the Service is still ours until the end, and the address
// is not given to another Service while this one's status still shows it.
func (r *Reconciler) reconcileDelete(ctx context.Context, svc *corev1.Service) error {
	event.Publish(r.Recorder, deleting(svc))
	if err := Forget(ctx, r.Client, svc); err != nil {
		return err
	}
	r.release(client.ObjectKeyFromObject(svc))
	event.Publish(r.Recorder, deleted(svc))
	return nil
}

// Forget takes away what ebb wrote on a Service it served: first its
// load-balancer status and ebb's conditions (unless it is being deleted),
// then the cleanup finalizer and ebb's mark, so that a failure half-way
// leaves it still marked as ebb's and a retry completes it. Both patches
// carry the optimistic lock: conditions and finalizers are lists, which a
// merge patch replaces whole, so a stale svc would drop what another
// writer added meanwhile (a conflict asks the caller to read it again). A
// Service already gone is done. The controller's clean-up uses it, and
// `ebb uninstall` once the controller is gone.
func Forget(ctx context.Context, c client.Client, svc *corev1.Service) error {
	if svc.DeletionTimestamp == nil && (len(svc.Status.LoadBalancer.Ingress) > 0 || meta.FindStatusCondition(svc.Status.Conditions, lbmodel.ServedCondition) != nil ||
		meta.FindStatusCondition(svc.Status.Conditions, AddressAssignedCondition) != nil) {
		patch := client.MergeFromWithOptions(svc.DeepCopy(), client.MergeFromWithOptimisticLock{})
		svc.Status.LoadBalancer = corev1.LoadBalancerStatus{}
		meta.RemoveStatusCondition(&svc.Status.Conditions, lbmodel.ServedCondition)
		meta.RemoveStatusCondition(&svc.Status.Conditions, AddressAssignedCondition)
		if err := c.Status().Patch(ctx, svc, patch); apierrors.IsNotFound(err) {
			return nil
		} else if err != nil {
			return fmt.Errorf("clearing the load balancer status of %s: %w", klog.KObj(svc), err)
		}
	}
	// Without the mark, a restart never takes the Service for ebb's again:
	// the finalizer is KEP-1959's, shared by every implementation, and the
	// one that serves the Service next may add it.
	patch := client.MergeFromWithOptions(svc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(svc, lbmodel.CleanupFinalizer)
	delete(svc.Annotations, lbmodel.ServedByAnnotation)
	if err := c.Patch(ctx, svc, patch); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing the finalizer of %s: %w", klog.KObj(svc), err)
	}
	return nil
}

// release frees a Service's addresses and wakes the Services waiting for
// one. Without the wake, a waiting Service would look again only at its
// retry (30 s later): the pools' status, which also wakes it, may have
// been counted before the release.
func (r *Reconciler) release(svc types.NamespacedName) {
	had := len(r.IPAM.Owned(svc)) > 0
	r.IPAM.Release(svc)
	if !had {
		return
	}
	select {
	case r.released <- ctrlevent.GenericEvent{Object: &corev1.Service{}}:
	default: // a wake is pending already, and covers this one
	}
}

// allocate returns the Service's addresses: the ones it asks for, or the
// ones it holds, or new ones, one per IP family it uses, as its
// spec.ipFamilyPolicy allows. skipped says, for a PreferDualStack Service
// served in fewer families than it has, which family got no address and
// why. On an error the Service holds what it held before and nothing new.
func (r *Reconciler) allocate(svc *corev1.Service, holder Holder) (addrs []netip.Addr, skipped string, err error) {
	held := r.IPAM.Owned(client.ObjectKeyFromObject(svc))
	defer func() {
		if err != nil {
			r.releaseExcept(holder, held)
		}
	}()
	requested, err := requestedAddrs(svc)
	if err != nil {
		return nil, "", err
	}
	if len(requested) > 0 {
		if err := requestFitsFamilies(svc, requested); err != nil {
			return nil, "", err
		}
		for _, addr := range requested {
			if err := r.IPAM.Claim(addr, holder); err != nil {
				return nil, "", fmt.Errorf("%w; ask for a free address of the pools or remove the request", err)
			}
		}
		r.releaseExcept(holder, requested)
		return requested, "", nil
	}
	var missing []string
	for _, fam := range familiesOf(svc) {
		addr, err := r.familyAddr(holder, held, fam == corev1.IPv6Protocol)
		if err != nil {
			if !preferDualStack(svc) {
				return nil, "", familyError(svc, fam, err)
			}
			missing = append(missing, fmt.Sprintf("no %s address (%v)", fam, err))
			continue
		}
		addrs = append(addrs, addr)
	}
	if len(addrs) == 0 {
		return nil, "", fmt.Errorf("PreferDualStack, but %s: add an AddressPool (lb.ebb.dev) that takes the Service, or free an address", strings.Join(missing, "; "))
	}
	r.releaseExcept(holder, addrs)
	if len(missing) > 0 {
		skipped = fmt.Sprintf("PreferDualStack: %s, so the load balancer serves %s only; add an AddressPool (lb.ebb.dev) of the missing family that takes the Service to serve both", strings.Join(missing, "; "), familyOf(addrs[0]))
	}
	return addrs, skipped, nil
}

// reportConflicts warns about each address in svc's status that other
// Services hold and svc may not share, and returns them: svc gives them up
// (allocate gives it others, or writeNotAssigned takes them away).
func (r *Reconciler) reportConflicts(svc *corev1.Service, holder Holder) []netip.Addr {
	var out []netip.Addr
	for _, addr := range lbmodel.Addresses(svc) {
		if others := r.IPAM.Conflicting(addr, holder); len(others) > 0 {
			event.Publish(r.Recorder, addressConflict(svc, addr, others))
			r.Metrics.failed("address_conflict")
			out = append(out, addr.Unmap())
		}
	}
	return out
}

// releaseExcept frees the Service's addresses that it no longer uses, and
// refreshes its ports on the ones it keeps.
func (r *Reconciler) releaseExcept(h Holder, keep []netip.Addr) {
	r.IPAM.Release(h.Service)
	for _, k := range keep {
		// Checked when allocated or claimed: a Service keeps an address
		// whose pool has gone since.
		r.IPAM.Record(k, h)
	}
}

// holder describes a Service to the allocator, with its namespace's labels
// (a namespace that cannot be read has none).
func (r *Reconciler) holder(ctx context.Context, svc *corev1.Service) (Holder, error) {
	ns := &corev1.Namespace{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: svc.Namespace}, ns); err != nil {
		if !apierrors.IsNotFound(err) {
			return Holder{}, fmt.Errorf("reading namespace %s for the address pools' selectors: %w", svc.Namespace, err)
		}
	}
	return holderOf(svc, ns.Labels), nil
}

// holderOf describes a Service to the allocator.
func holderOf(svc *corev1.Service, namespaceLabels map[string]string) Holder {
	h := Holder{Service: client.ObjectKeyFromObject(svc), ShareKey: svc.Annotations[ShareAnnotation],
		Pool: svc.Annotations[lbv1alpha1.PoolAnnotation], Labels: svc.Labels, NamespaceLabels: namespaceLabels}
	for _, p := range svc.Spec.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		h.Ports = append(h.Ports, fmt.Sprintf("%s/%d", proto, p.Port))
	}
	return h
}

// requestedAddrs reads spec.loadBalancerIP and the annotation.
func requestedAddrs(svc *corev1.Service) ([]netip.Addr, error) {
	var raw []string
	if v := svc.Annotations[RequestedIPsAnnotation]; v != "" {
		raw = strings.Split(v, ",")
	} else if svc.Spec.LoadBalancerIP != "" {
		raw = []string{svc.Spec.LoadBalancerIP}
	}
	var out []netip.Addr
	for _, s := range raw {
		addr, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("requested address %q is not an IP address: fix annotation %s or spec.loadBalancerIP", s, RequestedIPsAnnotation)
		}
		out = append(out, addr.Unmap())
	}
	return out, nil
}

func unsupportedPorts(svc *corev1.Service) error {
	var bad []string
	for _, p := range svc.Spec.Ports {
		if p.Protocol == corev1.ProtocolSCTP {
			bad = append(bad, fmt.Sprintf("%s (%d)", p.Name, p.Port))
		}
	}
	if len(bad) > 0 {
		return errors.New("ports " + strings.Join(bad, ", ") + " use protocol SCTP, which ebb's load balancer does not serve: change them to TCP or UDP")
	}
	return nil
}

// ingressFor is the Service's status: each address, reached through a
// proxy, on each of the Service's ports (the data plane serves them all).
func ingressFor(svc *corev1.Service, addrs []netip.Addr) []corev1.LoadBalancerIngress {
	var ports []corev1.PortStatus
	for _, p := range svc.Spec.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		ports = append(ports, corev1.PortStatus{Port: p.Port, Protocol: proto})
	}
	out := make([]corev1.LoadBalancerIngress, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, corev1.LoadBalancerIngress{IP: a.String(), IPMode: ptr.To(corev1.LoadBalancerIPModeProxy), Ports: slices.Clone(ports)})
	}
	return out
}

func equalIngress(a, b []corev1.LoadBalancerIngress) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].IP != b[i].IP || a[i].Hostname != b[i].Hostname || ptr.Deref(a[i].IPMode, "") != ptr.Deref(b[i].IPMode, "") ||
			!apiequality.Semantic.DeepEqual(a[i].Ports, b[i].Ports) {
			return false
		}
	}
	return true
}

func joinAddrs(addrs []netip.Addr) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}
