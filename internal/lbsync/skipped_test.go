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
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ebbdev/ebb/internal/dataplane"
)

// A skipped frontend is reported on its Service once per change, its
// recovery once, and the retry backs off while anything stays skipped:
// only retries that were due move the backoff on, not syncs that other
// events cause meanwhile (CI once saw a busy port freed and not served
// for over 30 s: every unrelated sync had doubled the wait).
func TestSkipReporterReportsChangesOnly(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}}
	rec := events.NewFakeRecorder(10)
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	r := newSkipReporter(rec, clk)
	r.expect(map[string]*corev1.Service{"ns/web:http/TCP@10.0.0.7": svc, "ns/web:http/TCP@192.0.2.1": svc})
	busy := []dataplane.SkippedFrontend{{Name: "ns/web:http/TCP@10.0.0.7", Reason: dataplane.SkipListenFailed, Err: errors.New("address already in use")}}
	outside := []dataplane.SkippedFrontend{{Name: "ns/web:http/TCP@192.0.2.1", Reason: SkipOutsidePools, Err: outsidePools("192.0.2.1")}}

	steps := []struct {
		name      string
		after     time.Duration // since the previous step
		skipped   []dataplane.SkippedFrontend
		refused   []dataplane.SkippedFrontend
		wantEvent string // prefix of the one event expected, "" for none
		wantRetry time.Duration
	}{
		{"first skip", 0, busy, nil, "Warning FrontendNotServed", time.Second},
		{"retried, same skip", time.Second, busy, nil, "", 2 * time.Second},
		{"retried, still skipped", 2 * time.Second, busy, nil, "", 4 * time.Second},
		{"an unrelated sync before the retry is due", time.Second, busy, nil, "", 3 * time.Second},
		{"another one", 2 * time.Second, busy, nil, "", time.Second},
		{"retried", time.Second, busy, nil, "", 8 * time.Second},
		{"retried", 8 * time.Second, busy, nil, "", 10 * time.Second},
		{"retried at most every 10 s", 10 * time.Second, busy, nil, "", 10 * time.Second},
		{"served again", 10 * time.Second, nil, nil, "Normal FrontendServed", 0},
		{"nothing skipped", time.Second, nil, nil, "", 0},
		{"skipped anew", time.Second, busy, nil, "Warning FrontendNotServed", time.Second},
		{"served again", time.Second, nil, nil, "Normal FrontendServed", 0},
		// An address outside the pools is said once and waits for a change:
		// no retry of its own, and the retries of a skip beside it start
		// from the first step.
		{"refused outside the pools", time.Second, nil, outside, "Warning FrontendNotServed", 0},
		{"still refused", time.Second, nil, outside, "", 0},
		{"still refused", time.Second, nil, outside, "", 0},
		{"a skip beside it", time.Second, busy, outside, "Warning FrontendNotServed", time.Second},
	}
	for _, step := range steps {
		clk.SetTime(clk.Now().Add(step.after))
		retry := r.report(logr.Discard(), step.skipped, step.refused)
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
