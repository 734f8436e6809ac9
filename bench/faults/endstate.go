package main

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster"
)

// after is what must have happened since a fault ended for ebb to be
// whole again, beyond every pod being Ready: a dead process's last Lease
// renewal or report is still fresh for a while, and must not count.
type after struct {
	// since is when the fault ended.
	since time.Time
	// killed are the pods the fault killed, as they were just before.
	killed []corev1.Pod
	// lease: a controller renewed the leader Lease since, and not
	// notHolder (the killed leader's identity, if one was).
	lease     bool
	notHolder string
	// reportsFrom are the hosts whose ebb lb must have written its report
	// since; allReports: every replica's.
	reportsFrom []string
	allReports  bool
}

// whole says what keeps ebb from being whole again ("" when it is): every
// killed pod restarted (or replaced), every ebb pod Ready, a controller
// leading with a fresh Lease, every ebb lb reporting on time, and what a
// requires since the fault.
func whole(ctx context.Context, c *localcluster.Cluster, cl client.Client, a after) string {
	for _, k := range a.killed {
		var p corev1.Pod
		err := cl.Get(ctx, client.ObjectKeyFromObject(&k), &p)
		if apierrors.IsNotFound(err) || (err == nil && p.UID != k.UID) {
			continue // replaced: its Deployment or DaemonSet says when the new one is Ready
		}
		if err != nil {
			return "reading pod " + k.Name + ": " + err.Error()
		}
		if !startedSince(&p, a.since) {
			return "kubelet has not restarted the killed " + k.Name + " yet"
		}
	}
	var d appsv1.Deployment
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ebbNamespace, Name: "ebb-controller"}, &d); err != nil {
		return "reading the controller's Deployment: " + err.Error()
	}
	if want := *d.Spec.Replicas; d.Status.ReadyReplicas != want || d.Status.UpdatedReplicas != want {
		return fmt.Sprintf("%d of %d controller replicas ready", d.Status.ReadyReplicas, want)
	}
	for _, name := range []string{"ebb-lb", "ebb-node-agent"} {
		var ds appsv1.DaemonSet
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ebbNamespace, Name: name}, &ds); err != nil {
			return "reading DaemonSet " + name + ": " + err.Error()
		}
		if ds.Status.NumberReady != ds.Status.DesiredNumberScheduled {
			return fmt.Sprintf("%d of %d %s pods ready", ds.Status.NumberReady, ds.Status.DesiredNumberScheduled, name)
		}
	}
	lease, err := c.Client.CoordinationV1().Leases(ebbNamespace).Get(ctx, "ebb-controller", metav1.GetOptions{})
	if err != nil {
		return "reading the controller's Lease: " + err.Error()
	}
	renewed := lease.Spec.RenewTime != nil && time.Since(lease.Spec.RenewTime.Time) <= 15*time.Second
	if a.lease {
		renewed = renewed && lease.Spec.RenewTime.After(a.since) && ptr.Deref(lease.Spec.HolderIdentity, "") != a.notHolder
	}
	if !renewed {
		return "no controller has renewed the leader Lease yet"
	}
	return reportsMissing(ctx, cl, a)
}

// startedSince says whether every container of the pod runs, and started
// after t (a restart count can be read before kubelet counted a kill).
func startedSince(p *corev1.Pod, t time.Time) bool {
	if len(p.Status.ContainerStatuses) == 0 {
		return false
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Running == nil || !s.State.Running.StartedAt.After(t.Add(-time.Second)) { // the API keeps whole seconds
			return false
		}
	}
	return true
}

// reportsMissing names a report that is stale, or not written since the
// fault although a requires it ("" when none).
func reportsMissing(ctx context.Context, cl client.Client, a after) string {
	if stale := staleReports(ctx, cl); stale != "" {
		return stale
	}
	var reports v1alpha1.LoadBalancerReportList
	if err := cl.List(ctx, &reports); err != nil {
		return "listing the LoadBalancerReports: " + err.Error()
	}
	for _, r := range reports.Items {
		must := a.allReports || slices.Contains(a.reportsFrom, r.Status.HostNode)
		if must && (r.Status.RenewTime == nil || !r.Status.RenewTime.After(a.since)) {
			return fmt.Sprintf("LoadBalancerReport %s not written since the fault", r.Name)
		}
	}
	return ""
}

// staleReports names the ebb lb reports that are not fresh ("" when none).
func staleReports(ctx context.Context, cl client.Client) string {
	var reports v1alpha1.LoadBalancerReportList
	if err := cl.List(ctx, &reports); err != nil {
		return "listing the LoadBalancerReports: " + err.Error()
	}
	if len(reports.Items) == 0 {
		return "no LoadBalancerReport"
	}
	for _, r := range reports.Items {
		if !r.Fresh(metav1.Now()) {
			return fmt.Sprintf("LoadBalancerReport %s not renewed within three heartbeats", r.Name)
		}
	}
	return ""
}

// waitWhole polls whole until it holds or timeout passes; it returns how
// long that took from the end of the fault and, on timeout, what was still
// missing.
func waitWhole(ctx context.Context, c *localcluster.Cluster, cl client.Client, a after, timeout time.Duration) (time.Duration, string) {
	missing := ""
	for time.Since(a.since) < timeout && ctx.Err() == nil {
		if missing = whole(ctx, c, cl, a); missing == "" {
			return time.Since(a.since), ""
		}
		sleep(ctx, 250*time.Millisecond)
	}
	return time.Since(a.since), missing
}

// endState lists what is left half done once the scenario is over: a
// maintenance not Complete, a node still cordoned or tainted by ebb, an
// Evacuation left, a Service of the run's namespace without its address,
// or with one another Service also has, a stale report.
func endState(ctx context.Context, cl client.Client, ns string) []string {
	var v []string
	var nms v1alpha1.NodeMaintenanceList
	if err := cl.List(ctx, &nms); err != nil {
		return []string{"listing NodeMaintenances: " + err.Error()}
	}
	for _, nm := range nms.Items {
		if nm.Spec.Stage != v1alpha1.Complete {
			v = append(v, fmt.Sprintf("NodeMaintenance %s in stage %s", nm.Name, nm.Spec.Stage))
		}
		if c := meta.FindStatusCondition(nm.Status.Conditions, v1alpha1.ReconciledCondition); c == nil || c.Status != metav1.ConditionTrue {
			v = append(v, fmt.Sprintf("NodeMaintenance %s not reconciled: %+v", nm.Name, c))
		}
	}
	var nodes corev1.NodeList
	if err := cl.List(ctx, &nodes); err != nil {
		return append(v, "listing Nodes: "+err.Error())
	}
	for _, n := range nodes.Items {
		if n.Spec.Unschedulable {
			v = append(v, "node "+n.Name+" still cordoned")
		}
		for _, t := range n.Spec.Taints {
			if t.Key == lbmodel.TaintDraining {
				v = append(v, fmt.Sprintf("node %s still has the taint %s=%s", n.Name, t.Key, t.Value))
			}
		}
		if _, ok := n.Annotations[v1alpha1.CordonAnnotation]; ok {
			v = append(v, "node "+n.Name+" still has the annotation "+v1alpha1.CordonAnnotation)
		}
	}
	var evs v1alpha1.EvacuationList
	if err := cl.List(ctx, &evs); err != nil {
		return append(v, "listing Evacuations: "+err.Error())
	}
	for _, e := range evs.Items {
		v = append(v, fmt.Sprintf("Evacuation %s/%s left (finalizers %v)", e.Namespace, e.Name, e.Finalizers))
	}
	v = append(v, addressViolations(ctx, cl, ns)...)
	if stale := staleReports(ctx, cl); stale != "" {
		v = append(v, stale)
	}
	return v
}

// addressViolations: every LoadBalancer Service of ns has an address, at
// most one per family, and no other Service has it.
func addressViolations(ctx context.Context, cl client.Client, ns string) []string {
	var svcs corev1.ServiceList
	if err := cl.List(ctx, &svcs); err != nil {
		return []string{"listing Services: " + err.Error()}
	}
	var v []string
	owner := map[netip.Addr]string{}
	for _, s := range svcs.Items {
		if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
			continue
		}
		name := s.Namespace + "/" + s.Name
		families := map[bool]int{}
		for _, in := range s.Status.LoadBalancer.Ingress {
			a, err := netip.ParseAddr(in.IP)
			if err != nil {
				v = append(v, fmt.Sprintf("Service %s has the address %q", name, in.IP))
				continue
			}
			families[a.Is4()]++
			if other, ok := owner[a]; ok {
				v = append(v, fmt.Sprintf("Services %s and %s both have %s", other, name, a))
			}
			owner[a] = name
		}
		if s.Namespace == ns && len(s.Status.LoadBalancer.Ingress) == 0 {
			v = append(v, "Service "+name+" has no address")
		}
		if families[true] > 1 || families[false] > 1 {
			v = append(v, fmt.Sprintf("Service %s has more than one address of a family: %v", name, s.Status.LoadBalancer.Ingress))
		}
	}
	return v
}

// writeLoops watches the objects ebb writes for quiet, and names those
// written more than most times in it: a controller that keeps writing what
// it already wrote.
func writeLoops(ctx context.Context, cl client.WithWatch, quiet time.Duration, most int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, quiet)
	defer cancel()
	lists := map[string]client.ObjectList{
		"Node":            &corev1.NodeList{},
		"Service":         &corev1.ServiceList{},
		"NodeMaintenance": &v1alpha1.NodeMaintenanceList{},
		"Evacuation":      &v1alpha1.EvacuationList{},
	}
	var mu sync.Mutex
	writes := map[string]int{}
	var wg sync.WaitGroup
	for kind, list := range lists {
		// Watched from the list's resource version: only what is written
		// from now on counts, not the objects that exist.
		if err := cl.List(ctx, list); err != nil {
			return nil, fmt.Errorf("listing %ss: %w", kind, err)
		}
		w, err := cl.Watch(ctx, list, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}})
		if err != nil {
			return nil, fmt.Errorf("watching %ss: %w", kind, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-w.ResultChan():
					if !ok {
						return
					}
					o, isObject := ev.Object.(client.Object)
					if ev.Type == watch.Bookmark || ev.Type == watch.Error || !isObject {
						continue
					}
					mu.Lock()
					writes[kind+" "+client.ObjectKeyFromObject(o).String()]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	var loops []string
	for key, n := range writes {
		if n > most {
			loops = append(loops, fmt.Sprintf("%s written %d times in %s", key, n, quiet))
		}
	}
	sort.Strings(loops)
	return loops, nil
}

// released deletes the run's maintenances and waits for them to go: a
// finalizer that stays is a violation.
func released(ctx context.Context, cl client.Client, timeout time.Duration) []string {
	var nms v1alpha1.NodeMaintenanceList
	if err := cl.List(ctx, &nms); err != nil {
		return []string{"listing NodeMaintenances: " + err.Error()}
	}
	for i := range nms.Items {
		if err := cl.Delete(ctx, &nms.Items[i]); err != nil && !apierrors.IsNotFound(err) {
			return []string{fmt.Sprintf("deleting NodeMaintenance %s: %v", nms.Items[i].Name, err)}
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		var left v1alpha1.NodeMaintenanceList
		if err := cl.List(ctx, &left); err != nil {
			return []string{"listing NodeMaintenances: " + err.Error()}
		}
		if len(left.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			var v []string
			for _, nm := range left.Items {
				v = append(v, fmt.Sprintf("NodeMaintenance %s not gone %s after its deletion (finalizers %v)", nm.Name, timeout, nm.Finalizers))
			}
			return v
		}
		sleep(ctx, 250*time.Millisecond)
	}
}
