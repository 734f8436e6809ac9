package nodehealth

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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
	cordoned := &corev1.Node{Spec: corev1.NodeSpec{Unschedulable: true, Taints: []corev1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule}}}}
	taintedBy := func(key string) *corev1.Node {
		return &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: key, Effect: corev1.TaintEffectNoSchedule}}}}
	}
	labelled := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"example.com/retiring": "true"}}}
	custom := lbmodel.Options{LeavingSignals: []lbmodel.LeavingSignal{{Kind: lbmodel.SignalLabel, Key: "example.com/retiring", Value: "true"}}}
	tests := []struct {
		name     string
		node     *corev1.Node
		model    lbmodel.Options
		set      bool
		wantCode int
	}{
		// Not read yet (an agent restarted while the API server is
		// unreachable): eligible, so that an outage does not fail every
		// node at once.
		{"not read yet", nil, lbmodel.Options{}, false, http.StatusOK},
		{"healthy node", &corev1.Node{}, lbmodel.Options{}, true, http.StatusOK},
		{"cordoned node is still eligible", cordoned, lbmodel.Options{}, true, http.StatusOK},
		{"tainted for deletion by the autoscaler", tainted, lbmodel.Options{}, true, http.StatusServiceUnavailable},
		{"autoscaler's taint ignored", tainted, lbmodel.Options{IgnoreAutoscalerTaint: true}, true, http.StatusOK},
		// Issue 49: every default leaving signal, not only kube-proxy's.
		{"disrupted by Karpenter", taintedBy(lbmodel.TaintKarpenterDisrupted), lbmodel.Options{}, true, http.StatusServiceUnavailable},
		{"drained by medik8s", taintedBy(lbmodel.TaintMedik8sDrain), lbmodel.Options{}, true, http.StatusServiceUnavailable},
		{"out of service", taintedBy(lbmodel.TaintOutOfService), lbmodel.Options{}, true, http.StatusServiceUnavailable},
		{"a NodeMaintenance's taint", taintedBy(lbmodel.TaintDraining), lbmodel.Options{}, true, http.StatusServiceUnavailable},
		{"a configured label", labelled, custom, true, http.StatusServiceUnavailable},
		{"a default signal left out of the configuration", taintedBy(lbmodel.TaintKarpenterDisrupted), custom, true, http.StatusOK},
		{"being deleted", deleting, lbmodel.Options{}, true, http.StatusServiceUnavailable},
		{"deleted", nil, lbmodel.Options{}, true, http.StatusServiceUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := NewMetrics(prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			clk := testingclock.NewFakePassiveClock(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
			s := New(m, clk, tt.model)
			if tt.set {
				if err := s.SetNode(tt.node); err != nil {
					t.Fatal(err)
				}
			}
			clk.SetTime(clk.Now().Add(3 * time.Second))
			code, a := get(t, s, "/healthz")
			if code != tt.wantCode {
				t.Errorf("/healthz: %d, want %d", code, tt.wantCode)
			}
			now := time.Date(2026, 11, 22, 0, 0, 3, 0, time.UTC)
			if a.NodeEligible == nil || *a.NodeEligible != (tt.wantCode == http.StatusOK) || !a.CurrentTime.Equal(now) || !a.Healthy {
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

// An agent restarted while the API server is unreachable answers from the
// state it saved before (issue 50 item 16; before, it answered 503 until it
// read its node, so an outage failed every node's health check at once),
// and the node, once read, decides. The state is saved when eligibility
// changes, not at every update of the node.
func TestRestartAnswersFromTheSavedState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	clk := testingclock.NewFakePassiveClock(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
	saves := 0
	save := FileSaver(path)
	before := New(m, clk, lbmodel.Options{})
	before.SaveTo(func(st State) error { saves++; return save(st) })
	tainted := &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: lbmodel.TaintToBeDeleted, Effect: corev1.TaintEffectNoSchedule}}}}
	for _, n := range []*corev1.Node{{}, {}, tainted, tainted} {
		if err := before.SetNode(n); err != nil {
			t.Fatal(err)
		}
	}
	if saves != 2 {
		t.Errorf("%d saves for two changes of eligibility", saves)
	}
	// A failed save is tried again at the next update, even without a
	// change.
	failing := true
	retried := New(m, clk, lbmodel.Options{})
	retried.SaveTo(func(st State) error {
		saves++
		if failing {
			return errors.New("disk full")
		}
		return nil
	})
	saves = 0
	if err := retried.SetNode(tainted); err == nil {
		t.Errorf("a failed save was not reported")
	}
	failing = false
	for range 2 {
		if err := retried.SetNode(tainted); err != nil {
			t.Fatal(err)
		}
	}
	if saves != 2 {
		t.Errorf("%d save attempts, want the failed one and one retry", saves)
	}

	st, ok, err := LoadState(path)
	if err != nil || !ok || st.Eligible {
		t.Fatalf("saved state %+v, %v, %v; want ineligible", st, ok, err)
	}
	m2, _ := NewMetrics(prometheus.NewRegistry())
	after := New(m2, clk, lbmodel.Options{})
	after.Restore(st)
	if code, _ := get(t, after, "/healthz"); code != http.StatusServiceUnavailable {
		t.Errorf("restarted, from the saved state of a node tainted for deletion: %d, want 503", code)
	}
	if testutil.ToFloat64(m2.Known) != 0 {
		t.Errorf("ebb_node_state_known is 1 before the node was read")
	}
	if err := after.SetNode(&corev1.Node{}); err != nil {
		t.Fatal(err)
	}
	after.Restore(st) // a late restore never overrides what was read
	if code, _ := get(t, after, "/healthz"); code != http.StatusOK {
		t.Errorf("once the node is read and eligible: %d, want 200", code)
	}
	if testutil.ToFloat64(m2.Known) != 1 {
		t.Errorf("ebb_node_state_known is 0 after the node was read")
	}
}

// A missing state file is no state; a damaged or oversized one is an error
// (reported, then ignored by the agent).
func TestLoadState(t *testing.T) {
	dir := t.TempDir()
	if _, ok, err := LoadState(filepath.Join(dir, "none")); ok || err != nil {
		t.Errorf("a missing file: %v, %v", ok, err)
	}
	for name, content := range map[string]string{"damaged": "{eligible", "huge": `{"eligible":true,"x":"` + strings.Repeat("a", maxStateFile) + `"}`} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := LoadState(p); ok || err == nil {
			t.Errorf("%s file: %v, %v; want an error", name, ok, err)
		}
	}
}
