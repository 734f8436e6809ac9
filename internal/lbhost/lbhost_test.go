package lbhost

import (
	"reflect"
	"testing"
	"time"

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
	for _, tc := range []struct {
		name    string
		reports []v1alpha1.LoadBalancerReport
		gone    []string
		want    Stranding
	}{
		{"another host serves", []v1alpha1.LoadBalancerReport{report("lb-a", "a", false, 0), report("lb-b", "b", false, 0)}, []string{"a"}, Stranding{}},
		{"every host goes", []v1alpha1.LoadBalancerReport{report("lb-b", "b", false, 0), report("lb-a", "a", false, 0)}, []string{"a", "b"},
			Stranding{Hosts: []string{"a", "b"}, Stranded: []string{"lb-a on a", "lb-b on b"}}},
		{"the other replica drains, the other report is stale", []v1alpha1.LoadBalancerReport{report("lb-a", "a", false, 0), report("lb-b", "b", true, 0), report("lb-c", "c", false, time.Hour)}, []string{"a"},
			Stranding{Hosts: []string{"a"}, Stranded: []string{"lb-a on a"}}},
		{"no replica names its host", []v1alpha1.LoadBalancerReport{report("lb", "", false, 0)}, []string{"a"}, Stranding{}},
		{"no report", nil, []string{"a"}, Stranding{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gone := map[string]bool{}
			for _, n := range tc.gone {
				gone[n] = true
			}
			got := Check(tc.reports, metav1.NewTime(now), func(n string) bool { return gone[n] })
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if got.Strands() != (len(tc.want.Stranded) > 0) {
				t.Errorf("Strands() = %v", got.Strands())
			}
		})
	}
}
