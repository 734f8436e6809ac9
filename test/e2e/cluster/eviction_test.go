package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// The Eviction API honours a PodDisruptionBudget that the real disruption
// controller keeps: an eviction that would break the budget gets 429, one
// that does not succeeds, and the pod is gone after its grace period.
func TestEvictionRespectsPodDisruptionBudget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, ctx)
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, cluster.AppDeployment(ns, "guarded", 2), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	minAvailable := intstr.FromInt32(2)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guarded"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: &minAvailable,
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}},
		},
	}
	if _, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitDeploymentAvailable(ctx, ns, "guarded", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	waitPDB := func(allowed int32) {
		eventually(t, ctx, 30*time.Second, fmt.Sprintf("the PDB to allow %d disruptions", allowed), func(ctx context.Context) (bool, string) {
			got, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "guarded", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return got.Status.ObservedGeneration == got.Generation && got.Status.CurrentHealthy == 2 && got.Status.DisruptionsAllowed == allowed,
				fmt.Sprintf("status %+v", got.Status)
		})
	}
	waitPDB(0)
	pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=guarded"})
	if err != nil || len(pods.Items) != 2 {
		t.Fatalf("listing pods: %v (%d pods)", err, len(pods.Items))
	}
	victim := pods.Items[0]
	evict := func() error {
		return cluster.Client.CoreV1().Pods(ns).EvictV1(ctx, &policyv1.Eviction{
			ObjectMeta:    metav1.ObjectMeta{Namespace: ns, Name: victim.Name},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &victim.UID}},
		})
	}
	err = evict()
	if !apierrors.IsTooManyRequests(err) {
		t.Fatalf("evicting %s against a PDB with no disruptions allowed: got %v, want 429 Too Many Requests", victim.Name, err)
	}

	got, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "guarded", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Spec.MinAvailable = ptr.To(intstr.FromInt32(1))
	if _, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPDB(1)
	evicted := time.Now()
	if err := evict(); err != nil {
		t.Fatalf("evicting %s with a disruption allowed: %v", victim.Name, err)
	}
	grace := time.Duration(*victim.Spec.TerminationGracePeriodSeconds) * time.Second
	eventually(t, ctx, grace+30*time.Second, "the evicted pod to be gone", func(ctx context.Context) (bool, string) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, victim.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && p.UID != victim.UID) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		return false, fmt.Sprintf("pod still there, deletionTimestamp %v", p.DeletionTimestamp)
	})
	t.Logf("evicted pod gone %s after the eviction (grace period %s)", time.Since(evicted).Round(time.Millisecond), grace)
}
