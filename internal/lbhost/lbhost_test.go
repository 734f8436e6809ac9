package lbhost

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
)

func TestCheck(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	report := func(name, host string, draining bool, age time.Duration) v1alpha1.LoadBalancerReport {
		ts := metav1.NewMicroTime(now.Add(-age))
		return v1alpha1.LoadBalancerReport{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1alpha1.LoadBalancerReportStatus{
			Replica: name, HostNode: host, Draining: draining, RenewTime: &ts, HeartbeatSeconds: 10}}
	}
	pod := func(name, node string, phase corev1.PodPhase) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ebb-system"}, Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
	}
	for _, tc := range []struct {
		name    string
		reports []v1alpha1.LoadBalancerReport
		pods    []corev1.Pod
		gone    []string
		want    Stranding
	}{
		{"another host serves", []v1alpha1.LoadBalancerReport{report("lb-a", "a", false, 0), report("lb-b", "b", false, 0)}, nil, []string{"a"}, Stranding{}},
		{"every host goes", []v1alpha1.LoadBalancerReport{report("lb-b", "b", false, 0), report("lb-a", "a", false, 0)}, nil, []string{"a", "b"},
			Stranding{Hosts: []string{"a", "b"}, Stranded: []string{"lb-a on a", "lb-b on b"}}},
		{"the other replica drains, the other report is stale", []v1alpha1.LoadBalancerReport{report("lb-a", "a", false, 0), report("lb-b", "b", true, 0), report("lb-c", "c", false, time.Hour)}, nil, []string{"a"},
			Stranding{Hosts: []string{"a"}, Stranded: []string{"lb-a on a"}}},
		{"no replica names its host", []v1alpha1.LoadBalancerReport{report("lb", "", false, 0)}, nil, []string{"a"}, Stranding{}},
		{"no report and no ebb lb pod", nil, nil, []string{"a"}, Stranding{}},
		// Fail closed (issue 42 item 5): a running ebb lb pod without a
		// fresh report is a replica whose state is unknown, not one that
		// is gone.
		{"no fresh report, but ebb lb pods run on every host", []v1alpha1.LoadBalancerReport{report("lb-b", "b", false, time.Hour)},
			[]corev1.Pod{pod("lb-a", "a", corev1.PodRunning), pod("lb-b", "b", corev1.PodRunning)}, []string{"a", "b"},
			Stranding{Hosts: []string{"a", "b"}, Stranded: []string{"lb-a on a (no fresh LoadBalancerReport)", "lb-b on b (no fresh LoadBalancerReport)"}}},
		{"an unreported pod on a host that stays", []v1alpha1.LoadBalancerReport{report("lb-a", "a", false, 0)},
			[]corev1.Pod{pod("lb-a", "a", corev1.PodRunning), pod("lb-b", "b", corev1.PodRunning)}, []string{"a"}, Stranding{}},
		{"a pending or failed pod is no replica", nil,
			[]corev1.Pod{pod("lb-a", "a", corev1.PodPending), pod("lb-b", "b", corev1.PodFailed)}, []string{"a", "b"}, Stranding{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gone := map[string]bool{}
			for _, n := range tc.gone {
				gone[n] = true
			}
			at := metav1.NewTime(now)
			got := Check(tc.reports, Unreported(tc.pods, tc.reports, at), at, func(n string) bool { return gone[n] })
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if got.Strands() != (len(tc.want.Stranded) > 0) {
				t.Errorf("Strands() = %v", got.Strands())
			}
		})
	}
}
