package nodehealth

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

func get(t *testing.T, s *Server, path string) (int, answer) {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	var a answer
	if err := json.NewDecoder(rec.Body).Decode(&a); err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
	return rec.Code, a
}

func TestHealthz(t *testing.T) {
	tainted := &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: lbmodel.TaintToBeDeleted, Effect: corev1.TaintEffectNoSchedule}}}}
	deleting := &corev1.Node{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{}}}
	cordoned := &corev1.Node{Spec: corev1.NodeSpec{Unschedulable: true}}
	tests := []struct {
		name     string
		node     *corev1.Node
		set      bool
		wantCode int
	}{
		{"unknown node", nil, false, http.StatusServiceUnavailable},
		{"healthy node", &corev1.Node{}, true, http.StatusOK},
		{"cordoned node is still eligible", cordoned, true, http.StatusOK},
		{"tainted for deletion by the autoscaler", tainted, true, http.StatusServiceUnavailable},
		{"being deleted", deleting, true, http.StatusServiceUnavailable},
		{"deleted", nil, true, http.StatusServiceUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := NewMetrics(prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			clk := testingclock.NewFakePassiveClock(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
			s := New(m, clk)
			if tt.set {
				s.SetNode(tt.node)
			}
			clk.SetTime(clk.Now().Add(3 * time.Second))
			code, a := get(t, s, "/healthz")
			if code != tt.wantCode {
				t.Errorf("/healthz: %d, want %d", code, tt.wantCode)
			}
			if a.NodeEligible == nil || *a.NodeEligible != (tt.wantCode == http.StatusOK) || a.CurrentTime != "2026-11-22T00:00:03Z" {
				t.Errorf("/healthz body %+v", a)
			}
			if tt.set && a.LastUpdated != "2026-11-22T00:00:00Z" {
				t.Errorf("lastUpdated %q", a.LastUpdated)
			}
			// /livez keeps its process-only meaning.
			if code, _ := get(t, s, "/livez"); code != http.StatusOK {
				t.Errorf("/livez: %d, want 200", code)
			}
			if got := testutil.ToFloat64(m.Healthz.WithLabelValues(itoa(tt.wantCode))); got != 1 {
				t.Errorf("healthz counter for %d = %v", tt.wantCode, got)
			}
			if got := testutil.ToFloat64(m.Livez.WithLabelValues("200")); got != 1 {
				t.Errorf("livez counter = %v", got)
			}
		})
	}
}

func itoa(code int) string {
	switch code {
	case http.StatusOK:
		return "200"
	default:
		return "503"
	}
}
