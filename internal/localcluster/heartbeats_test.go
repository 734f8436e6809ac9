package localcluster

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 11, 25, 20, 0, 0, 0, time.UTC)

func lease(node string, renewed time.Time) coordinationv1.Lease {
	return coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: corev1.NamespaceNodeLease},
		Spec:       coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: renewed}},
	}
}

func TestHeartbeatWatchReportsEachLapseOnce(t *testing.T) {
	type step struct {
		at     time.Time
		leases []coordinationv1.Lease
		want   []heartbeatChange
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "renewed in time: nothing",
			steps: []step{
				{at: t0.Add(25 * time.Second), leases: []coordinationv1.Lease{lease("node-1", t0), lease("node-2", t0.Add(20*time.Second))}},
			},
		},
		{
			name: "a lapse starts once and ends once",
			steps: []step{
				{at: t0.Add(31 * time.Second), leases: []coordinationv1.Lease{lease("node-2", t0), lease("node-1", t0)},
					want: []heartbeatChange{{node: "node-1", renewed: t0, started: true}, {node: "node-2", renewed: t0, started: true}}},
				{at: t0.Add(90 * time.Second), leases: []coordinationv1.Lease{lease("node-1", t0), lease("node-2", t0)}},
				{at: t0.Add(130 * time.Second), leases: []coordinationv1.Lease{lease("node-1", t0.Add(125*time.Second)), lease("node-2", t0)},
					want: []heartbeatChange{{node: "node-1", renewed: t0}}},
			},
		},
		{
			name: "a deleted node's lapse is forgotten",
			steps: []step{
				{at: t0.Add(40 * time.Second), leases: []coordinationv1.Lease{lease("node-3", t0)},
					want: []heartbeatChange{{node: "node-3", renewed: t0, started: true}}},
				{at: t0.Add(45 * time.Second)},
				{at: t0.Add(50 * time.Second), leases: []coordinationv1.Lease{lease("node-3", t0.Add(48*time.Second))}},
			},
		},
		{
			name: "a Lease without a renew time is skipped",
			steps: []step{
				{at: t0.Add(time.Hour), leases: []coordinationv1.Lease{{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &heartbeatWatch{lapsed: map[string]time.Time{}}
			for i, s := range tt.steps {
				got := w.observe(s.leases, s.at)
				if len(got) != len(s.want) {
					t.Fatalf("step %d: got %+v, want %+v", i, got, s.want)
				}
				for j := range got {
					if got[j] != s.want[j] {
						t.Errorf("step %d: got %+v, want %+v", i, got, s.want)
					}
				}
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for the watcher's writes and the
// test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestWatchHeartbeatsPrintsALapseWithKwoksLeaseLines(t *testing.T) {
	kwokLog := filepath.Join(t.TempDir(), "kwok.log")
	log := "level=INFO msg=\"Syncing lease\" node=node-1\nlevel=INFO msg=\"Watch pods\"\nlevel=ERROR msg=\"Failed to sync lease\" err=\"conflict\" node=node-1\n"
	if err := os.WriteFile(kwokLog, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	l := lease("node-1", t0)
	client := fake.NewClientset(&l)
	clk := testingclock.NewFakeClock(t0)
	out := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchHeartbeats(ctx, client, clk, out, kwokLog)
	}()
	defer func() { cancel(); <-done }()

	waitFor := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if strings.Contains(out.String(), what) {
				return
			}
			if clk.HasWaiters() {
				clk.Step(heartbeatPoll)
			}
		}
		t.Fatalf("no %q in:\n%s", what, out.String())
	}
	waitFor("node node-1's heartbeats lapsed")
	text := out.String()
	if !strings.Contains(text, "Failed to sync lease") || strings.Contains(text, "Watch pods") {
		t.Errorf("the report should quote kwok's lines about leases and only those:\n%s", text)
	}

	l.Spec.RenewTime = &metav1.MicroTime{Time: clk.Now()}
	if _, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Update(ctx, &l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("node node-1's heartbeats are back")
}
