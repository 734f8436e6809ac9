package lbsync

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	"github.com/ebbdev/ebb/internal/dataplane"
)

// A skipped frontend is reported on its Service once per change, its
// recovery once, and the retry backs off while anything stays skipped.
func TestSkipReporterReportsChangesOnly(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}}
	rec := events.NewFakeRecorder(10)
	r := newSkipReporter(rec)
	r.expect(map[string]*corev1.Service{"ns/web:http/TCP@10.0.0.7": svc})
	busy := []dataplane.SkippedFrontend{{Name: "ns/web:http/TCP@10.0.0.7", Reason: dataplane.SkipListenFailed, Err: errors.New("address already in use")}}

	steps := []struct {
		name      string
		skipped   []dataplane.SkippedFrontend
		wantEvent string // prefix of the one event expected, "" for none
		wantRetry time.Duration
	}{
		{"first skip", busy, "Warning FrontendNotServed", time.Second},
		{"same skip again", busy, "", 2 * time.Second},
		{"still skipped", busy, "", 4 * time.Second},
		{"served again", nil, "Normal FrontendServed", 0},
		{"nothing skipped", nil, "", 0},
		{"skipped anew", busy, "Warning FrontendNotServed", time.Second},
	}
	for _, step := range steps {
		retry := r.report(logr.Discard(), step.skipped)
		if retry != step.wantRetry {
			t.Errorf("%s: retry in %s, want %s", step.name, retry, step.wantRetry)
		}
		var got []string
		for len(rec.Events) > 0 {
			got = append(got, <-rec.Events)
		}
		switch {
		case step.wantEvent == "" && len(got) != 0:
			t.Errorf("%s: events %q, want none", step.name, got)
		case step.wantEvent != "" && (len(got) != 1 || !strings.HasPrefix(got[0], step.wantEvent)):
			t.Errorf("%s: events %q, want one %q", step.name, got, step.wantEvent)
		}
	}
}
