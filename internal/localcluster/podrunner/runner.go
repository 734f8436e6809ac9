// Package podrunner runs the pods of a local cluster whose images it has
// (ebb's own, from the OCI layout `make image` writes) as real processes,
// as a kubelet and a container runtime would: each container's program
// from the image's filesystem, with the pod's command, arguments and
// environment (downward API included), its volumes (the projected
// service-account token at the standard path) in a mount namespace of its
// own, in the node's network (hostNetwork) or a network namespace of the
// pod's with its pod IP, with capabilities as its security context says,
// readiness and liveness probes run, SIGTERM then SIGKILL after the grace
// period on deletion, and a restart when it exits. kwok keeps simulating
// everything else about pods (scheduling to fake nodes, IPs, deletion).
package podrunner

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// Machines are the cluster's hosts: a node's by its name, and a new
// network namespace for a pod on one.
type Machines interface {
	Host(name string) (*network.Host, bool)
	AddPod(node *network.Host, name string, ips ...netip.Addr) (*network.Pod, error)
}

// Options configure a Runner.
type Options struct {
	Client   kubernetes.Interface
	Images   *Images
	Machines Machines
	// Dir holds the pods' volumes; LogDir each container's output
	// (NAMESPACE_POD_CONTAINER.log).
	Dir, LogDir string
	// APIServer is the `kubernetes` Service's ClusterIP and port, for
	// KUBERNETES_SERVICE_HOST and _PORT.
	APIServerHost string
	APIServerPort int
}

// Runner runs the pods whose every container's image is in Images.
type Runner struct {
	opts     Options
	recorder record.EventRecorder

	mu   sync.Mutex
	pods map[types.UID]*podRun
	wg   sync.WaitGroup
}

// New returns a Runner; Run starts it.
func New(opts Options) *Runner {
	return &Runner{opts: opts, pods: map[types.UID]*podRun{}}
}

// Runs reports whether the pod is one this runner runs (every container's
// image is in its store); the pod simulators leave those alone.
func (r *Runner) Runs(pod *corev1.Pod) bool {
	if len(pod.Spec.Containers) == 0 {
		return false
	}
	for _, c := range pod.Spec.Containers {
		if !r.opts.Images.Has(c.Image) {
			return false
		}
	}
	return true
}

// Run runs pods until ctx is done, then kills every process (the cluster
// is going away) and returns.
func (r *Runner) Run(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("podrunner")
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: r.opts.Client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	r.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet"})

	factory := informers.NewSharedInformerFactory(r.opts.Client, 0)
	inf := factory.Core().V1().Pods().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.observe(ctx, log, obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { r.observe(ctx, log, obj.(*corev1.Pod)) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				r.gone(pod)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
	r.mu.Lock()
	for _, p := range r.pods {
		p.kill()
	}
	r.mu.Unlock()
	r.wg.Wait()
	return nil
}

// observe starts a pod that has its IP, or tells a running one what
// changed (a deletion, a status someone else wrote).
func (r *Runner) observe(ctx context.Context, log logr.Logger, pod *corev1.Pod) {
	if pod.Spec.NodeName == "" || pod.Status.PodIP == "" || !r.Runs(pod) {
		return
	}
	if _, ok := r.opts.Machines.Host(pod.Spec.NodeName); !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.pods[pod.UID]; ok {
		p.update(pod)
		return
	}
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return
	}
	p := newPodRun(r, pod, log.WithValues("pod", pod.Namespace+"/"+pod.Name))
	r.pods[pod.UID] = p
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		p.run(ctx)
		r.mu.Lock()
		delete(r.pods, pod.UID)
		r.mu.Unlock()
		if current := p.current(); current.DeletionTimestamp != nil && ctx.Err() == nil {
			r.removeStopped(ctx, log, current)
		}
	}()
}

// removeStopped deletes a pod being deleted once its containers have
// stopped, with no grace period left, as a kubelet does: the pod is gone
// from the API when its processes are, not at the end of its grace period
// (kwok's own pod-delete stage picks a random moment up to it).
func (r *Runner) removeStopped(ctx context.Context, log logr.Logger, pod *corev1.Pod) {
	err := r.opts.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0), Preconditions: metav1.NewUIDPreconditions(string(pod.UID))})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		log.Info("Removing a stopped pod", "pod", pod.Namespace+"/"+pod.Name, "err", err.Error())
	}
}

// gone handles a pod deleted from the API: if it still runs (a forced
// deletion), it stops now, with its grace period.
func (r *Runner) gone(pod *corev1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.pods[pod.UID]; ok {
		p.deleted()
	}
}
