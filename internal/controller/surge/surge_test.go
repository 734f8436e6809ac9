package surge

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

// objects: a Deployment of one replica, its ReplicaSet and pod, and the
// pod's Evacuation with the surge evacuator active.
func objects() (*appsv1.Deployment, *appsv1.ReplicaSet, *corev1.Pod, *v1alpha1.Evacuation) {
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "d", Annotations: map[string]string{v1alpha1.SurgeEvacuationAnnotation: "true"}},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1", UID: "r",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "d", Controller: ptr.To(true)}}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1-a", UID: "p", Labels: map[string]string{"app": "web"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-1", UID: "r", Controller: ptr.To(true)}}}}
	e := &v1alpha1.Evacuation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: v1alpha1.EvacuationName(pod.UID, pod.Name)},
		Spec:   v1alpha1.EvacuationSpec{PodRef: v1alpha1.PodReference{Name: pod.Name, UID: pod.UID}},
		Status: v1alpha1.EvacuationStatus{ActiveEvacuatorClass: v1alpha1.SurgeEvacuatorClass}}
	return dep, rs, pod, e
}

func newEvacuator(t *testing.T, objs ...client.Object) (*Evacuator, client.Client) {
	t.Helper()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(&v1alpha1.Evacuation{}).Build()
	return &Evacuator{Client: cl, Recorder: events.NewFakeRecorder(100)}, cl
}

func TestSurgeStartsAndRestoresOnCancellation(t *testing.T) {
	dep, rs, pod, e := objects()
	s, cl := newEvacuator(t, dep, rs, pod, e)
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(e)}
	s.SetupClock()
	if _, err := s.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	got := &appsv1.Deployment{}
	_ = cl.Get(ctx, client.ObjectKeyFromObject(dep), got)
	if *got.Spec.Replicas != 2 || got.Annotations[v1alpha1.SurgeOriginalReplicasAnnotation] != "1" || !strings.HasPrefix(got.Annotations[v1alpha1.SurgeLockAnnotation], e.Name+"/") {
		t.Fatalf("after the start: replicas %d annotations %v", *got.Spec.Replicas, got.Annotations)
	}
	p := &corev1.Pod{}
	_ = cl.Get(ctx, client.ObjectKeyFromObject(pod), p)
	if p.Annotations[DeletionCostAnnotation] != "" {
		t.Fatalf("pod marked before the new pod is Ready: %v", p.Annotations)
	}

	// Cancelled: the instigators withdrew and the Evacuation is gone.
	_ = cl.Delete(ctx, e)
	if _, err := s.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	_ = cl.Get(ctx, client.ObjectKeyFromObject(dep), got)
	_ = cl.Get(ctx, client.ObjectKeyFromObject(pod), p)
	if *got.Spec.Replicas != 1 || got.Annotations[v1alpha1.SurgeLockAnnotation] != "" || p.Annotations[DeletionCostAnnotation] != "" {
		t.Errorf("after cancellation: replicas %d, annotations %v, pod %v", *got.Spec.Replicas, got.Annotations, p.Annotations)
	}
}

// Issue 41 item 10: the surge evacuator scaled whatever Deployment owned
// the pod of an Evacuation that listed it, opted in or not. It acts only
// for a Deployment that opted in, on itself or in its pod template; a pod
// annotated by hand (or an Evacuation listing the evacuator) is handed on.
func TestSurgeOnlyForADeploymentThatOptedIn(t *testing.T) {
	key := v1alpha1.EvacuatorAnnotationPrefix + v1alpha1.SurgeEvacuatorClass
	for _, tc := range []struct {
		name  string
		optIn func(*appsv1.Deployment, *corev1.Pod)
		surge bool
	}{
		{"the Deployment's annotation", func(*appsv1.Deployment, *corev1.Pod) {}, true},
		{"the pod template's evacuator annotation", func(d *appsv1.Deployment, _ *corev1.Pod) {
			d.Annotations = nil
			d.Spec.Template.Annotations = map[string]string{key: v1alpha1.SurgeEvacuatorRegistration}
		}, true},
		{"only the pod, annotated by hand", func(d *appsv1.Deployment, p *corev1.Pod) {
			d.Annotations = nil
			p.Annotations = map[string]string{key: v1alpha1.SurgeEvacuatorRegistration}
		}, false},
		{"the annotation set to false", func(d *appsv1.Deployment, _ *corev1.Pod) {
			d.Annotations[v1alpha1.SurgeEvacuationAnnotation] = "false"
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dep, rs, pod, e := objects()
			tc.optIn(dep, pod)
			s, cl := newEvacuator(t, dep, rs, pod, e)
			s.SetupClock()
			ctx := context.Background()
			if _, err := s.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(e)}); err != nil {
				t.Fatal(err)
			}
			got := &appsv1.Deployment{}
			_ = cl.Get(ctx, client.ObjectKeyFromObject(dep), got)
			gotE := &v1alpha1.Evacuation{}
			_ = cl.Get(ctx, client.ObjectKeyFromObject(e), gotE)
			surged := *got.Spec.Replicas == 2
			if surged != tc.surge {
				t.Errorf("surged %v, want %v (replicas %d, message %q)", surged, tc.surge, *got.Spec.Replicas, gotE.Status.Message)
			}
			if !tc.surge && (!gotE.Status.ActiveEvacuatorCompleted || !strings.Contains(gotE.Status.Message, "did not opt in")) {
				t.Errorf("not handed on: completed %v, message %q", gotE.Status.ActiveEvacuatorCompleted, gotE.Status.Message)
			}
		})
	}
}

func TestSurgeHandsOnWhenAnHPAOwnsTheScale(t *testing.T) {
	dep, rs, pod, e := objects()
	hpa := &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{Kind: "Deployment", Name: "web", APIVersion: "apps/v1"}, MaxReplicas: 3}}
	s, cl := newEvacuator(t, dep, rs, pod, e, hpa)
	s.SetupClock()
	if _, err := s.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(e)}); err != nil {
		t.Fatal(err)
	}
	got := &v1alpha1.Evacuation{}
	_ = cl.Get(context.Background(), client.ObjectKeyFromObject(e), got)
	if !got.Status.ActiveEvacuatorCompleted || !strings.Contains(got.Status.Message, "HorizontalPodAutoscaler web owns the scale") {
		t.Errorf("status %+v, want handed on because of the HPA", got.Status)
	}
	d := &appsv1.Deployment{}
	_ = cl.Get(context.Background(), client.ObjectKeyFromObject(dep), d)
	if *d.Spec.Replicas != 1 {
		t.Error("scaled a Deployment an HPA owns")
	}
}

// The pod is marked the cheapest to delete only once a peer is Ready, just
// before the scale-down it steers.
func TestSurgeMarksThePodRightBeforeScalingBack(t *testing.T) {
	dep, rs, pod, e := objects()
	s, cl := newEvacuator(t, dep, rs, pod, e)
	s.SetupClock()
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(e)}
	if _, err := s.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	peer := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1-b", UID: "q", Labels: map[string]string{"app": "web"}},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	if err := cl.Create(ctx, peer); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	p, got := &corev1.Pod{}, &appsv1.Deployment{}
	_ = cl.Get(ctx, client.ObjectKeyFromObject(pod), p)
	_ = cl.Get(ctx, client.ObjectKeyFromObject(dep), got)
	if p.Annotations[DeletionCostAnnotation] != "-2147483648" || *got.Spec.Replicas != 1 || !strings.HasSuffix(got.Annotations[v1alpha1.SurgeLockAnnotation], "/"+phaseReleasing) {
		t.Errorf("after the peer is Ready: pod %v, replicas %d, lock %q", p.Annotations, *got.Spec.Replicas, got.Annotations[v1alpha1.SurgeLockAnnotation])
	}
}

// A lock outlives its Evacuation when the Evacuation goes while ebb is
// down; the Deployment, listed at start, wakes the lock's owner, whose
// absence releases the lock and the surge.
func TestALockWhoseEvacuationIsGoneIsReleased(t *testing.T) {
	dep, rs, pod, e := objects()
	dep.Spec.Replicas = ptr.To[int32](2)
	dep.Annotations = map[string]string{v1alpha1.SurgeLockAnnotation: e.Name + "/" + phaseSurging, v1alpha1.SurgeOriginalReplicasAnnotation: "1"}
	s, cl := newEvacuator(t, dep, rs, pod) // the Evacuation is gone
	s.SetupClock()
	ctx := context.Background()
	reqs := lockOwner(ctx, dep)
	if len(reqs) != 1 || reqs[0].Namespace != "ns" || reqs[0].Name != e.Name {
		t.Fatalf("the locked Deployment maps to %v, want its owner %s", reqs, e.Name)
	}
	if _, err := s.Reconcile(ctx, reqs[0]); err != nil {
		t.Fatal(err)
	}
	got := &appsv1.Deployment{}
	_ = cl.Get(ctx, client.ObjectKeyFromObject(dep), got)
	if *got.Spec.Replicas != 1 || got.Annotations[v1alpha1.SurgeLockAnnotation] != "" {
		t.Errorf("replicas %d, annotations %v: the stale surge was not undone", *got.Spec.Replicas, got.Annotations)
	}
	unlocked := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "other"}}
	if reqs := lockOwner(ctx, unlocked); len(reqs) != 0 {
		t.Errorf("an unlocked Deployment maps to %v", reqs)
	}
}

// A Ready new pod is not yet traffic: the surge scales back only once
// every Service that sends the leaving pod traffic lists the other pods as
// Ready endpoints. Scaling back at Pod Ready let the proxies fall back to
// the leaving pod alone, and requests to the demo's single replica timed
// out once it stopped.
func TestSurgeScalesBackOnlyOnceTheEndpointsListTheNewPod(t *testing.T) {
	dep, rs, pod, e := objects()
	peer := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1-b", UID: "q", Labels: map[string]string{"app": "web"}},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	endpoint := func(uid types.UID, ready bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{"10.244.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", UID: uid}}
	}
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-abc", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{endpoint(pod.UID, true), endpoint(peer.UID, false)}}
	s, cl := newEvacuator(t, dep, rs, pod, e, slice)
	s.SetupClock()
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(e)}
	if _, err := s.Reconcile(ctx, req); err != nil { // surges
		t.Fatal(err)
	}
	if err := cl.Create(ctx, peer); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	got, gotE := &appsv1.Deployment{}, &v1alpha1.Evacuation{}
	_ = cl.Get(ctx, client.ObjectKeyFromObject(dep), got)
	_ = cl.Get(ctx, client.ObjectKeyFromObject(e), gotE)
	if *got.Spec.Replicas != 2 || !strings.Contains(gotE.Status.Message, "Service(s) web list no other pod") {
		t.Fatalf("with the new pod not Ready in Service web's endpoints: replicas %d, message %q; want still surged, waiting for them", *got.Spec.Replicas, gotE.Status.Message)
	}
	slice.Endpoints[1] = endpoint(peer.UID, true)
	if err := cl.Update(ctx, slice); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	_ = cl.Get(ctx, client.ObjectKeyFromObject(dep), got)
	if *got.Spec.Replicas != 1 {
		t.Errorf("with the new pod a Ready endpoint: replicas %d, want scaled back to 1", *got.Spec.Replicas)
	}
}

// releasedAnotherPod is objects() with the surge of one replica in its
// releasing phase, and the ReplicaSet removing another pod (web-1-b) than
// the marked one.
func releasedAnotherPod() (*appsv1.Deployment, *appsv1.ReplicaSet, *corev1.Pod, *v1alpha1.Evacuation, *corev1.Pod) {
	dep, rs, pod, e := objects()
	dep.Annotations[v1alpha1.SurgeLockAnnotation] = e.Name + "/" + phaseReleasing
	dep.Annotations[v1alpha1.SurgeOriginalReplicasAnnotation] = "1"
	now := metav1.Now()
	removed := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1-b", UID: "q", Labels: map[string]string{"app": "web"},
		DeletionTimestamp: &now, Finalizers: []string{"test/keep"}}}
	return dep, rs, pod, e, removed
}

// Issue 41 item 13: a ReplicaSet removes a pod that is not Ready before a
// Ready one, whatever the deletion costs. A new pod that flapped NotReady
// at the scale-back was removed instead of the marked one, the surge sat
// in its releasing phase with nothing reported, and the pod was evicted
// at the progress deadline (a minAvailable: 1 budget then blocked it for
// good). The surge now notices, says so, and surges again.
func TestSurgeStartsAgainWhenTheReplicaSetRemovedAnotherPod(t *testing.T) {
	dep, rs, pod, e, removed := releasedAnotherPod()
	pod.Annotations = map[string]string{DeletionCostAnnotation: "-2147483648"}
	s, cl := newEvacuator(t, dep, rs, pod, e, removed)
	s.SetupClock()
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(e)}
	if _, err := s.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	got, p, gotE := &appsv1.Deployment{}, &corev1.Pod{}, &v1alpha1.Evacuation{}
	_ = cl.Get(ctx, client.ObjectKeyFromObject(dep), got)
	_ = cl.Get(ctx, client.ObjectKeyFromObject(pod), p)
	_ = cl.Get(ctx, client.ObjectKeyFromObject(e), gotE)
	if got.Annotations[v1alpha1.SurgeLockAnnotation] != "" || p.Annotations[DeletionCostAnnotation] != "" || !strings.Contains(gotE.Status.Message, "removed pod web-1-b instead") {
		t.Fatalf("after the ReplicaSet removed another pod: lock %q, pod %v, message %q; want the surge released, the pod unmarked, and that said",
			got.Annotations[v1alpha1.SurgeLockAnnotation], p.Annotations, gotE.Status.Message)
	}
	if _, err := s.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	_ = cl.Get(ctx, client.ObjectKeyFromObject(dep), got)
	if *got.Spec.Replicas != 2 {
		t.Errorf("the next pass: replicas %d, want a new surge to 2", *got.Spec.Replicas)
	}
}

// A surge starts again at most maxSurgeRetries times: each start reports
// progress, so a pod whose readiness keeps flapping would otherwise keep
// its Evacuation from the progress deadline for ever. Then it hands on.
func TestSurgeHandsOnAfterItsRetries(t *testing.T) {
	dep, rs, pod, e, removed := releasedAnotherPod()
	e.Annotations = map[string]string{v1alpha1.SurgeRetriesAnnotation: "3"}
	// An ended pod the kubelet evicted earlier does not count as staying.
	ended := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1-c", UID: "r", Labels: map[string]string{"app": "web"}},
		Status: corev1.PodStatus{Phase: corev1.PodFailed}}
	s, cl := newEvacuator(t, dep, rs, pod, e, removed, ended)
	s.SetupClock()
	ctx := context.Background()
	if _, err := s.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(e)}); err != nil {
		t.Fatal(err)
	}
	gotE, got := &v1alpha1.Evacuation{}, &appsv1.Deployment{}
	_ = cl.Get(ctx, client.ObjectKeyFromObject(e), gotE)
	_ = cl.Get(ctx, client.ObjectKeyFromObject(dep), got)
	if !gotE.Status.ActiveEvacuatorCompleted || !strings.Contains(gotE.Status.Message, "4 times") || got.Annotations[v1alpha1.SurgeLockAnnotation] != "" {
		t.Errorf("after the third retry: completed %v, message %q, lock %q; want handed on, the surge released", gotE.Status.ActiveEvacuatorCompleted, gotE.Status.Message, got.Annotations[v1alpha1.SurgeLockAnnotation])
	}
}
