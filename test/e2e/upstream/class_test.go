package upstream_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
	"github.com/ebbdev/ebb/test/e2e/e2eutil"
)

// classPolicy gives every LoadBalancer Service that the upstream framework
// creates without a class ebb's class, as a user who runs ebb beside
// another implementation would write it: the upstream cases set no class,
// so this is how they run against ebb's class path. A
// MutatingAdmissionPolicy (GA in Kubernetes 1.36) on the namespaces the
// framework labels e2e-framework; a Service that sets a class of its own
// (the Services Conformance case's example.com/internal-vip) keeps it, and
// the class is set only where the API allows it: on create, and on the
// update that makes a Service a LoadBalancer.
const classPolicy = `apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata:
  name: ebb-upstream-e2e-class
spec:
  failurePolicy: Fail
  reinvocationPolicy: Never
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: ["v1"]
      operations: ["CREATE", "UPDATE"]
      resources: ["services"]
  matchConditions:
  - name: a-classless-load-balancer
    expression: >-
      object.spec.type == 'LoadBalancer' && !has(object.spec.loadBalancerClass) &&
      (request.operation == 'CREATE' || oldObject.spec.type != 'LoadBalancer')
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: >-
        Object{spec: Object.spec{loadBalancerClass: "%s"}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata:
  name: ebb-upstream-e2e-class
spec:
  policyName: ebb-upstream-e2e-class
  matchResources:
    namespaceSelector:
      matchExpressions:
      - {key: e2e-framework, operator: Exists}
`

// withClassPolicy installs classPolicy, waits until it is in effect (a
// Service created in a namespace like the framework's gets the class), and
// removes it after the test.
func withClassPolicy(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := ebbrun.ApplyYAML(ctx, cluster, "upstream-class-policy", fmt.Sprintf(classPolicy, lbmodel.ClassL4)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ar := cluster.Client.AdmissionregistrationV1()
		_ = ar.MutatingAdmissionPolicyBindings().Delete(ctx, "ebb-upstream-e2e-class", metav1.DeleteOptions{})
		_ = ar.MutatingAdmissionPolicies().Delete(ctx, "ebb-upstream-e2e-class", metav1.DeleteOptions{})
	})
	ns := e2eutil.NewNamespace(t, ctx, cluster)
	nsObj, err := cluster.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nsObj.Labels == nil {
		nsObj.Labels = map[string]string{}
	}
	nsObj.Labels["e2e-framework"] = "canary"
	if _, err := cluster.Client.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The policy reaches the API server's admission chain a moment after
	// its creation: create canaries until one gets the class.
	e2eutil.Eventually(t, ctx, time.Minute, "the class policy in effect", func(ctx context.Context) (bool, string) {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "canary-"},
			Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}},
		}
		got, err := cluster.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err.Error()
		}
		if got.Spec.LoadBalancerClass == nil {
			return false, "a canary Service got no class"
		}
		return *got.Spec.LoadBalancerClass == lbmodel.ClassL4, "a canary Service got class " + *got.Spec.LoadBalancerClass
	})
}
