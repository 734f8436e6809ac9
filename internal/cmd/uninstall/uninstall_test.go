package uninstall

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

// lbService is a LoadBalancer Service with an address in its status.
func lbService(name string, class *string, finalizer bool, mark string) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name, Annotations: map[string]string{}},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: class},
		Status: corev1.ServiceStatus{
			LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "192.0.2.1"}}},
			Conditions:   []metav1.Condition{{Type: lbmodel.ServedCondition, Status: metav1.ConditionTrue, Reason: "Served", LastTransitionTime: metav1.Now()}},
		},
	}
	if finalizer {
		s.Finalizers = []string{lbmodel.CleanupFinalizer}
	}
	if mark != "" {
		s.Annotations[lbmodel.ServedByAnnotation] = mark
	}
	return s
}

func TestReleaseServices(t *testing.T) {
	other := "example.com/other"
	for _, tc := range []struct {
		name     string
		svc      *corev1.Service
		released bool
	}{
		{"marked as ebb's", lbService("marked", nil, true, lbmodel.ClassL4), true},
		{"of ebb's class, not marked (older ebb)", lbService("class", ptr.To(lbmodel.ClassL4), true, ""), true},
		{"another implementation's, same finalizer", lbService("other", &other, true, ""), false},
		{"class-less, finalizer but no mark", lbService("classless", nil, true, ""), false},
		{"of ebb's class, no finalizer", lbService("nofinalizer", ptr.To(lbmodel.ClassL4), false, ""), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithObjects(tc.svc).WithStatusSubresource(&corev1.Service{}).Build()
			if err := ReleaseServices(context.Background(), c, lbmodel.ClassL4); err != nil {
				t.Fatal(err)
			}
			var got corev1.Service
			if err := c.Get(context.Background(), client.ObjectKeyFromObject(tc.svc), &got); err != nil {
				t.Fatal(err)
			}
			held := slices.Contains(got.Finalizers, lbmodel.CleanupFinalizer)
			hasAddress := len(got.Status.LoadBalancer.Ingress) > 0
			if tc.released {
				if held || hasAddress || got.Annotations[lbmodel.ServedByAnnotation] != "" || len(got.Status.Conditions) != 0 {
					t.Errorf("not released: finalizers %v, ingress %v, annotations %v, conditions %v", got.Finalizers, got.Status.LoadBalancer.Ingress, got.Annotations, got.Status.Conditions)
				}
				return
			}
			if held != slices.Contains(tc.svc.Finalizers, lbmodel.CleanupFinalizer) || !hasAddress {
				t.Errorf("touched: finalizers %v, ingress %v", got.Finalizers, got.Status.LoadBalancer.Ingress)
			}
		})
	}
}

// A Service being deleted loses the finalizer that held it, and goes.
func TestReleaseServicesLetsADeletionFinish(t *testing.T) {
	svc := lbService("deleting", ptr.To(lbmodel.ClassL4), true, lbmodel.ClassL4)
	c := fake.NewClientBuilder().WithObjects(svc).WithStatusSubresource(&corev1.Service{}).Build()
	if err := c.Delete(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	if err := ReleaseServices(context.Background(), c, lbmodel.ClassL4); err != nil {
		t.Fatal(err)
	}
	var list corev1.ServiceList
	if err := c.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("still there: %v", list.Items[0].Finalizers)
	}
}

// Nothing is released while a controller pod runs: it would serve the
// Services again. The error says what to do.
func TestWaitControllerGone(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ebb-system", Name: "ebb-controller-1", Labels: map[string]string{"app.kubernetes.io/name": "ebb-controller"}}}
	c := fake.NewClientBuilder().WithObjects(pod).Build()
	err := waitControllerGone(context.Background(), c, "ebb-system", "app.kubernetes.io/name=ebb-controller", 1500*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "ebb-controller-1") || !strings.Contains(err.Error(), "remove ebb's Deployment first") {
		t.Errorf("with a controller pod: %v", err)
	}
	if err := waitControllerGone(context.Background(), c, "other", "app.kubernetes.io/name=ebb-controller", time.Second); err != nil {
		t.Errorf("no controller pod in namespace other: %v", err)
	}
	if err := waitControllerGone(context.Background(), c, "ebb-system", "a in (", time.Second); err == nil || !strings.Contains(err.Error(), "--controller-selector") {
		t.Errorf("a bad selector: %v", err)
	}
}

// A Service changed since the list (a conflict) is read again and
// released; another writer's finalizer stays.
func TestReleaseServicesRetriesAConflict(t *testing.T) {
	svc := lbService("busy", ptr.To(lbmodel.ClassL4), true, lbmodel.ClassL4)
	conflicts := 0
	c := fake.NewClientBuilder().WithObjects(svc).WithStatusSubresource(&corev1.Service{}).WithInterceptorFuncs(interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if conflicts == 0 {
				conflicts++
				// Another controller adds its finalizer meanwhile.
				var cur corev1.Service
				if err := c.Get(ctx, client.ObjectKeyFromObject(obj), &cur); err != nil {
					return err
				}
				cur.Finalizers = append(cur.Finalizers, "example.com/other")
				if err := c.Update(ctx, &cur); err != nil {
					return err
				}
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	}).Build()
	if err := ReleaseServices(context.Background(), c, lbmodel.ClassL4); err != nil {
		t.Fatal(err)
	}
	var got corev1.Service
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(svc), &got); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Finalizers, []string{"example.com/other"}) || len(got.Status.LoadBalancer.Ingress) != 0 {
		t.Errorf("finalizers %v, ingress %v; want only the other writer's finalizer, no address", got.Finalizers, got.Status.LoadBalancer.Ingress)
	}
}

// An API error while waiting for the controller's pods says so, rather
// than that pods are left.
func TestWaitControllerGoneSaysWhyItCannotList(t *testing.T) {
	c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
			return apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("no RBAC"))
		},
	}).Build()
	err := waitControllerGone(context.Background(), c, "ebb-system", "app.kubernetes.io/name=ebb-controller", 1500*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "listing ebb controller's pods") || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("got %v", err)
	}
}
