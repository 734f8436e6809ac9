package evacuation

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

const instigator = v1alpha1.InstigatorFinalizerPrefix + "test"

func setup(t *testing.T, pod *corev1.Pod, evacuators ...v1alpha1.Evacuator) (*Reconciler, client.Client, *clocktesting.FakeClock, ctrl.Request) {
	t.Helper()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	e := &v1alpha1.Evacuation{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: v1alpha1.EvacuationName(pod.UID, pod.Name), Finalizers: []string{instigator}},
		Spec:       v1alpha1.EvacuationSpec{PodRef: v1alpha1.PodReference{Name: pod.Name, UID: pod.UID}, ProgressDeadlineSeconds: 600, Evacuators: evacuators},
	}
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pod, e).WithStatusSubresource(&v1alpha1.Evacuation{}, &v1alpha1.NodeMaintenance{}).Build()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
	r := &Reconciler{Client: cl, Recorder: events.NewFakeRecorder(100), Clock: clk, Metrics: m}
	return r, cl, clk, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(e)}
}

// answerEvictions makes r's client answer every Eviction API call with
// answer (nil: the pod is evicted), and pass every other call to cl.
func answerEvictions(r *Reconciler, cl client.Client, answer func(ctx context.Context, c client.Client) error) {
	r.Client = interceptor.NewClient(cl.(client.WithWatch), interceptor.Funcs{
		SubResourceCreate: func(ctx context.Context, c client.Client, sub string, obj, subObj client.Object, opts ...client.SubResourceCreateOption) error {
			if sub == "eviction" {
				return answer(ctx, c)
			}
			return c.SubResource(sub).Create(ctx, obj, subObj, opts...)
		},
	})
}

func get(t *testing.T, cl client.Client, req ctrl.Request) *v1alpha1.Evacuation {
	t.Helper()
	e := &v1alpha1.Evacuation{}
	if err := cl.Get(context.Background(), req.NamespacedName, e); err != nil {
		t.Fatal(err)
	}
	return e
}

func reconcileOnce(t *testing.T, r *Reconciler, req ctrl.Request) ctrl.Result {
	t.Helper()
	res, err := r.Reconcile(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func testPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1", UID: "uid-1"}}
}

// Evacuators take turns by priority: the next one on completion or after
// the progress deadline without progress; with none left, the pod is
// evicted; once it is gone the Evacuation goes too.
func TestHandOffDeadlineAndEvictionFallback(t *testing.T) {
	pod := testPod()
	r, cl, clk, req := setup(t, pod,
		v1alpha1.Evacuator{EvacuatorClass: "low.example", Priority: 100},
		v1alpha1.Evacuator{EvacuatorClass: "high.example", Priority: 200, Role: "controller"})
	ctx := context.Background()

	res := reconcileOnce(t, r, req)
	e := get(t, cl, req)
	if e.Status.ActiveEvacuatorClass != "high.example" || res.RequeueAfter != 600*time.Second {
		t.Fatalf("active %q requeue %s, want high.example and the 600 s deadline", e.Status.ActiveEvacuatorClass, res.RequeueAfter)
	}

	clk.Step(100 * time.Second)
	res = reconcileOnce(t, r, req)
	if e = get(t, cl, req); e.Status.ActiveEvacuatorClass != "high.example" || res.RequeueAfter != 500*time.Second {
		t.Fatalf("before the deadline: active %q requeue %s", e.Status.ActiveEvacuatorClass, res.RequeueAfter)
	}
	// The evacuator reports completion (it did its part; the pod stays).
	e.Status.ActiveEvacuatorCompleted = true
	if err := cl.Status().Update(ctx, e); err != nil {
		t.Fatal(err)
	}
	reconcileOnce(t, r, req)
	if e = get(t, cl, req); e.Status.ActiveEvacuatorClass != "low.example" || e.Status.ActiveEvacuatorCompleted {
		t.Fatalf("after completion: active %q completed %v", e.Status.ActiveEvacuatorClass, e.Status.ActiveEvacuatorCompleted)
	}

	// low.example makes no progress for the whole deadline.
	clk.Step(600 * time.Second)
	reconcileOnce(t, r, req)
	e = get(t, cl, req)
	if e.Status.ActiveEvacuatorClass != "" || !meta.IsStatusConditionTrue(e.Status.Conditions, v1alpha1.EvictingCondition) {
		t.Fatalf("after the deadline: active %q conditions %v, want eviction", e.Status.ActiveEvacuatorClass, e.Status.Conditions)
	}
	if err := cl.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the pod was not evicted: %v", err)
	}
	reconcileOnce(t, r, req)
	if err := cl.Get(ctx, req.NamespacedName, &v1alpha1.Evacuation{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the Evacuation of a gone pod is still there: %v", err)
	}
}

// Without evacuators the pod is evicted at once; a static pod never is.
func TestEvictionWithoutEvacuatorAndStaticPods(t *testing.T) {
	r, cl, _, req := setup(t, testPod())
	reconcileOnce(t, r, req)
	if err := cl.Get(context.Background(), client.ObjectKeyFromObject(testPod()), &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Fatalf("not evicted: %v", err)
	}

	static := testPod()
	static.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "x"}
	r, cl, _, req = setup(t, static)
	reconcileOnce(t, r, req)
	if err := cl.Get(context.Background(), client.ObjectKeyFromObject(static), &corev1.Pod{}); err != nil {
		t.Fatalf("a static pod was evicted: %v", err)
	}
	if e := get(t, cl, req); e.Status.Message == "" {
		t.Error("no message for the static pod")
	}
}

// When every instigator has withdrawn the Evacuation is cancelled, unless
// its evacuator forbids cancellation.
func TestCancellation(t *testing.T) {
	for _, policy := range []v1alpha1.EvacuationCancellationPolicy{v1alpha1.CancellationAllow, v1alpha1.CancellationForbid} {
		r, cl, _, req := setup(t, testPod(), v1alpha1.Evacuator{EvacuatorClass: "x", Priority: 1})
		e := get(t, cl, req)
		e.Finalizers = nil
		if err := cl.Update(context.Background(), e); err != nil {
			t.Fatal(err)
		}
		e = get(t, cl, req)
		e.Status.EvacuationCancellationPolicy = policy
		if err := cl.Status().Update(context.Background(), e); err != nil {
			t.Fatal(err)
		}
		reconcileOnce(t, r, req)
		err := cl.Get(context.Background(), req.NamespacedName, &v1alpha1.Evacuation{})
		if policy == v1alpha1.CancellationAllow && !apierrors.IsNotFound(err) {
			t.Errorf("Allow: not cancelled (%v)", err)
		}
		if policy == v1alpha1.CancellationForbid && err != nil {
			t.Errorf("Forbid: cancelled (%v)", err)
		}
	}
}

func TestBackoff(t *testing.T) {
	for _, tt := range []struct {
		failures int32
		want     time.Duration
	}{{1, 2 * time.Second}, {2, 4 * time.Second}, {5, 32 * time.Second}, {20, 2 * time.Minute}} {
		if got := backoff(tt.failures); got != tt.want {
			t.Errorf("backoff(%d) = %s, want %s", tt.failures, got, tt.want)
		}
	}
}

// The gauges count the Evacuations when scraped.
func TestGaugesCountAtScrape(t *testing.T) {
	pod := testPod()
	r, cl, _, req := setup(t, pod, v1alpha1.Evacuator{EvacuatorClass: "x.example", Priority: 1})
	reconcileOnce(t, r, req)
	r.Metrics.readFrom(cl)
	page, err := testutil.CollectAndFormat(r.Metrics, expfmt.TypeTextPlain, "ebb_evacuation_evacuations", "ebb_evacuation_active_evacuators")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`ebb_evacuation_evacuations{phase="Evacuating"} 1`, `ebb_evacuation_evacuations{phase="Pending"} 0`, `ebb_evacuation_active_evacuators{class="x.example"} 1`} {
		if !strings.Contains(string(page), want) {
			t.Errorf("missing %s in\n%s", want, page)
		}
	}
}

// A refused eviction is retried after the backoff, not at the next event:
// the status write of the refusal, and pod updates, wake the controller at
// once, and those reconciles must not evict again.
func TestBlockedEvictionWaitsForItsBackoffWhateverWakesIt(t *testing.T) {
	pod := testPod()
	r, cl, clk, req := setup(t, pod)
	attempts := 0
	answerEvictions(r, cl, func(context.Context, client.Client) error {
		attempts++
		return apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	})
	for _, step := range []struct {
		advance      time.Duration
		wantAttempts int
		wantRequeue  time.Duration
	}{
		{0, 1, 2 * time.Second},                // refused: back off 2 s
		{0, 1, 2 * time.Second},                // woken at once by its own status write
		{time.Second, 1, time.Second},          // woken by the pod, halfway
		{time.Second, 2, 4 * time.Second},      // the backoff ran out: try again
		{3 * time.Second, 2, time.Second},      // woken early again
		{time.Second, 3, 8 * time.Second},      // third attempt
		{8 * time.Second, 4, 16 * time.Second}, // and so on, doubling
	} {
		clk.Step(step.advance)
		res := reconcileOnce(t, r, req)
		if attempts != step.wantAttempts || res.RequeueAfter != step.wantRequeue {
			t.Fatalf("after %s more: %d eviction attempts, requeue after %s; want %d and %s",
				step.advance, attempts, res.RequeueAfter, step.wantAttempts, step.wantRequeue)
		}
	}
	e := get(t, cl, req)
	if e.Status.FailedEvictionCounter != 4 || e.Status.NextEvictionTime == nil || !e.Status.NextEvictionTime.Time.Equal(clk.Now().Add(16*time.Second)) {
		t.Fatalf("status: %d failed evictions, next at %v (now %v)", e.Status.FailedEvictionCounter, e.Status.NextEvictionTime, clk.Now())
	}
}

// Evacuators go by descending priority, even far apart ones.
func TestNextEvacuatorOrder(t *testing.T) {
	evs := []v1alpha1.Evacuator{
		{EvacuatorClass: "lowest", Priority: -2147483648},
		{EvacuatorClass: "highest", Priority: 2147483647},
		{EvacuatorClass: "middle", Priority: 0},
	}
	for _, tt := range []struct{ current, want string }{
		{"", "highest"}, {"highest", "middle"}, {"middle", "lowest"}, {"lowest", ""}, {"unlisted", ""},
	} {
		if got := nextEvacuator(evs, tt.current); got != tt.want {
			t.Errorf("after %q: %q, want %q", tt.current, got, tt.want)
		}
	}
}

// A pod's events wake its Evacuation, and nothing for the many pods that
// have none.
func TestPodEventsWakeOnlyTheirEvacuation(t *testing.T) {
	pod := testPod()
	r, _, _, req := setup(t, pod)
	if got := r.evacuationOfPod(context.Background(), pod); len(got) != 1 || got[0] != req {
		t.Errorf("the pod with an Evacuation wakes %v, want %v", got, req)
	}
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-2", UID: "uid-2"}}
	if got := r.evacuationOfPod(context.Background(), other); len(got) != 0 {
		t.Errorf("a pod without an Evacuation wakes %v", got)
	}
}

// An eviction reports what KEP-4212's examples show an evacuator
// reporting: progress now, the expected finish at now plus the pod's grace
// period, and which maintenance is terminating the pod and why. A pod that
// terminates without us gets its deletionTimestamp as the expected finish.
func TestEvictionReportsWhenAndWhy(t *testing.T) {
	pod := testPod()
	pod.Finalizers = []string{"test/keep"} // stays terminating after the eviction
	grace := int64(45)
	pod.Spec.TerminationGracePeriodSeconds = &grace
	r, cl, clk, req := setup(t, pod)
	e := get(t, cl, req)
	e.Annotations = map[string]string{v1alpha1.RequestedByAnnotation: "kernel-upgrade", v1alpha1.ReasonAnnotation: "OS upgrade"}
	if err := cl.Update(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	reconcileOnce(t, r, req)
	e = get(t, cl, req)
	now := clk.Now()
	if p := e.Status.EvacuationProgressTimestamp; p == nil || !p.Time.Equal(now) {
		t.Errorf("evacuationProgressTimestamp %v, want %v", p, now)
	}
	if f := e.Status.ExpectedEvacuationFinishTime; f == nil || !f.Time.Equal(now.Add(45*time.Second)) {
		t.Errorf("expectedEvacuationFinishTime %v, want now + 45 s", f)
	}
	if want := "The Eviction API is terminating the pod due to node maintenance kernel-upgrade (OS upgrade)."; e.Status.Message != want {
		t.Errorf("message %q, want %q", e.Status.Message, want)
	}
	// The pod is terminating now: a later pass keeps the message.
	clk.Step(time.Second)
	reconcileOnce(t, r, req)
	if got := get(t, cl, req).Status.Message; got != e.Status.Message {
		t.Errorf("message changed to %q while the pod terminates", got)
	}

	// Someone else deletes a pod before any eviction.
	other := testPod()
	other.Finalizers = []string{"test/keep"}
	r, cl, _, req = setup(t, other, v1alpha1.Evacuator{EvacuatorClass: "slow.example", Priority: 1})
	if err := cl.Delete(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	terminating := &corev1.Pod{}
	if err := cl.Get(context.Background(), client.ObjectKeyFromObject(other), terminating); err != nil || terminating.DeletionTimestamp == nil {
		t.Fatalf("the pod is not terminating: %v", err)
	}
	reconcileOnce(t, r, req)
	if f := get(t, cl, req).Status.ExpectedEvacuationFinishTime; f == nil || !f.Time.Equal(terminating.DeletionTimestamp.Time) {
		t.Errorf("expectedEvacuationFinishTime %v, want the pod's deletionTimestamp %v", f, terminating.DeletionTimestamp)
	}
}

// The Eviction API's other answers: a 409 counts as gone when the pod was
// replaced (the UID precondition failed) and a 404 always, with no failure
// counted; a 409 while the pod is still there (the API server gave up on
// conflicting writes of its PodDisruptionBudget) is retried with the
// backoff of a refusal (issue 41 item 9: it was taken as gone, and the
// drain stalled); any other error is returned for a retry, with the
// message kept.
func TestEvictionConflictNotFoundAndErrors(t *testing.T) {
	conflict := apierrors.NewConflict(corev1.Resource("pods"), "web-1", errors.New("Precondition failed: UID in precondition: uid-1, UID in object meta: uid-2"))
	for _, tt := range []struct {
		name        string
		answer      error
		replace     bool
		wantErr     bool
		outcome     string
		wantText    string
		wantFailed  int32
		wantRequeue time.Duration
	}{
		{"409, the pod replaced", conflict, true, false, "gone", "", 0, 0},
		{"409, the pod still there", apierrors.NewConflict(corev1.Resource("poddisruptionbudgets"), "web", errors.New("the object has been modified")), false, false, "conflict", "Eviction conflicted", 1, 2 * time.Second},
		{"404: gone", apierrors.NewNotFound(corev1.Resource("pods"), "web-1"), false, false, "gone", "", 0, 0},
		{"500: retried", apierrors.NewInternalError(errors.New("etcd is slow")), false, true, "error", "Eviction failed", 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, cl, clk, req := setup(t, testPod())
			answerEvictions(r, cl, func(ctx context.Context, c client.Client) error {
				if tt.replace {
					if err := c.Delete(ctx, testPod()); err != nil {
						return err
					}
					again := testPod()
					again.UID = "uid-2"
					if err := c.Create(ctx, again); err != nil {
						return err
					}
				}
				return tt.answer
			})
			res, err := r.Reconcile(context.Background(), req)
			if (err != nil) != tt.wantErr {
				t.Fatalf("error %v, want one: %v", err, tt.wantErr)
			}
			if got := testutil.ToFloat64(r.Metrics.evictions.WithLabelValues(tt.outcome)); got != 1 {
				t.Errorf("evictions{outcome=%s} = %v, want 1", tt.outcome, got)
			}
			if res.RequeueAfter != tt.wantRequeue {
				t.Errorf("requeue after %s, want %s", res.RequeueAfter, tt.wantRequeue)
			}
			e := get(t, cl, req)
			if e.Status.FailedEvictionCounter != tt.wantFailed {
				t.Errorf("failedEvictionCounter %d, want %d", e.Status.FailedEvictionCounter, tt.wantFailed)
			}
			if tt.wantRequeue > 0 && (e.Status.NextEvictionTime == nil || !e.Status.NextEvictionTime.Time.Equal(clk.Now().Add(tt.wantRequeue))) {
				t.Errorf("nextEvictionTime %v, want %s from now", e.Status.NextEvictionTime, tt.wantRequeue)
			}
			if !strings.Contains(e.Status.Message, tt.wantText) {
				t.Errorf("message %q, want %q", e.Status.Message, tt.wantText)
			}
		})
	}
}

// A DaemonSet's pod is evicted only when a NodeMaintenance draining its
// node targets it (issue 41 item 12: KEP-4212 has the DaemonSet side
// ignore Evacuations above the drain targets, so that CNI, CSI and log
// daemons do not leave before the pods that depend on them). Before, any
// Evacuation evicted it.
func TestDaemonSetPodsWaitForTheDrainTargets(t *testing.T) {
	pod := testPod()
	pod.Spec.NodeName = "n1"
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "cni", UID: "ds-uid", Controller: ptr.To(true)}}
	r, cl, _, req := setup(t, pod)
	evictions := 0
	answerEvictions(r, cl, func(context.Context, client.Client) error {
		evictions++
		return nil
	})
	res := reconcileOnce(t, r, req)
	if evictions != 0 || res.RequeueAfter == 0 {
		t.Fatalf("no maintenance targets the DaemonSet's pod: %d evictions, requeue after %s; want none, and a look later", evictions, res.RequeueAfter)
	}
	if e := get(t, cl, req); !strings.Contains(e.Status.Message, "drain targets") {
		t.Errorf("message %q, want it to say the pod waits for the drain targets", e.Status.Message)
	}
	// A maintenance draining n1 whose targets are still on Default pods.
	nm := &v1alpha1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: v1alpha1.NodeMaintenanceSpec{Stage: v1alpha1.Drain},
		Status: v1alpha1.NodeMaintenanceStatus{NodeStatuses: []v1alpha1.NodeMaintenanceNodeStatus{{NodeRef: v1alpha1.NodeReference{Name: "n1"},
			DrainTargets: []v1alpha1.DrainPlanEntry{{PodType: v1alpha1.Default, PodPriority: 1 << 30}}}}}}
	if err := cl.Create(context.Background(), nm); err != nil {
		t.Fatal(err)
	}
	if reconcileOnce(t, r, req); evictions != 0 {
		t.Fatalf("targets on Default pods only: %d evictions, want none", evictions)
	}
	nm.Status.NodeStatuses[0].DrainTargets = append(nm.Status.NodeStatuses[0].DrainTargets, v1alpha1.DrainPlanEntry{PodType: v1alpha1.DaemonSet, PodPriority: 1 << 30})
	if err := cl.Status().Update(context.Background(), nm); err != nil {
		t.Fatal(err)
	}
	if reconcileOnce(t, r, req); evictions != 1 {
		t.Errorf("the targets reach the DaemonSet's pods: %d evictions, want 1", evictions)
	}
}
