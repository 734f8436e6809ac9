package nodehealth

import (
	"bytes"
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

// kubeProxyHealth is kube-proxy v1.36's /healthz and /livez body
// (pkg/proxy/healthcheck.ProxyHealth): ebb's must decode into it with no
// field left over.
type kubeProxyHealth struct {
	LastUpdated  time.Time      `json:"lastUpdated"`
	CurrentTime  time.Time      `json:"currentTime"`
	NodeEligible *bool          `json:"nodeEligible,omitempty"`
	Healthy      bool           `json:"healthy"`
	Status       map[string]any `json:"status,omitempty"`
}

func get(t *testing.T, s *Server, path string) (int, kubeProxyHealth) {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if got := rec.Header().Get("Content-Type"); got != "application/json" {
		t.Errorf("%s Content-Type %q, want kube-proxy's application/json", path, got)
	}
	if got := rec.Header().Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("%s X-Content-Type-Options %q, want kube-proxy's nosniff", path, got)
	}
	body := rec.Body.Bytes()
	if bytes.HasSuffix(body, []byte("\n")) {
		t.Errorf("%s body %q ends in a newline; kube-proxy's does not", path, body)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var a kubeProxyHealth
	if err := dec.Decode(&a); err != nil {
		t.Fatalf("decoding %s %q as kube-proxy's answer: %v", path, body, err)
	}
	for _, key := range []string{`"lastUpdated":`, `"currentTime":`, `"healthy":`} {
		if !bytes.Contains(body, []byte(key)) {
			t.Errorf("%s body %q has no %s", path, body, key)
		}
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
			now := time.Date(2026, 11, 22, 0, 0, 3, 0, time.UTC)
			if a.NodeEligible == nil || *a.NodeEligible != (tt.wantCode == http.StatusOK) || !a.CurrentTime.Equal(now) || a.Healthy != tt.set {
				t.Errorf("/healthz body %+v", a)
			}
			// As kube-proxy: lastUpdated is now when healthy, else the
			// last time the node was seen.
			switch {
			case tt.wantCode == http.StatusOK && !a.LastUpdated.Equal(now):
				t.Errorf("lastUpdated %s, want now", a.LastUpdated)
			case tt.wantCode != http.StatusOK && tt.set && !a.LastUpdated.Equal(now.Add(-3*time.Second)):
				t.Errorf("lastUpdated %s, want when the node was seen", a.LastUpdated)
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
