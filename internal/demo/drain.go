package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/kubectl/pkg/drain"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/stats"
)

// ebbDrain creates a NodeMaintenance in stage Drain and waits for Drained.
func (s *scenario) ebbDrain(ctx context.Context, ns, node string, since func() time.Duration, m *Markers) (time.Duration, func(context.Context) error, error) {
	cl, err := newClient(s.c)
	if err != nil {
		return 0, nil, err
	}
	nm := &v1alpha1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "demo-" + node + "-"},
		Spec: v1alpha1.NodeMaintenanceSpec{
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}},
			}}}},
			Stage: v1alpha1.Drain, Reason: "ebb demo: maintenance of " + node, TrafficDrainTimeoutSeconds: ptr.To[int32](60),
		},
	}
	if err := cl.Create(ctx, nm); err != nil {
		return 0, nil, fmt.Errorf("creating the NodeMaintenance: %w", err)
	}
	s.step("ebb: NodeMaintenance %s in stage Drain on %s: load balancers first, then pods", nm.Name, node)
	s.drainStarted(ctx, node)
	unanswered := false
	for {
		got := &v1alpha1.NodeMaintenance{}
		if err := cl.Get(ctx, client.ObjectKeyFromObject(nm), got); err != nil {
			if ctx.Err() != nil || !transient(err) {
				return 0, nil, fmt.Errorf("reading NodeMaintenance %s: %w", nm.Name, err)
			}
			// The API server may be away (a fault injected on purpose):
			// the maintenance goes on without this process watching.
			if !unanswered {
				s.step("ebb: reading NodeMaintenance %s: %v (trying again)", nm.Name, err)
				unanswered = true
			}
			sleep(ctx, 250*time.Millisecond)
			continue
		}
		unanswered = false
		if m.FirstEviction == 0 {
			for _, st := range got.Status.NodeStatuses {
				if st.PodsEvacuating > 0 {
					m.FirstEviction = since()
				}
			}
		}
		if meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.DrainedCondition) {
			end := since()
			s.step("ebb: %s drained in %.1fs (pods gone, no connection left through it)", node, (end - m.Drain).Seconds())
			complete := func(ctx context.Context) error {
				err := untilWritten(ctx, func(ctx context.Context) error {
					cur := &v1alpha1.NodeMaintenance{}
					if err := cl.Get(ctx, client.ObjectKeyFromObject(nm), cur); err != nil {
						return err
					}
					cur.Spec.Stage = v1alpha1.Complete
					return cl.Update(ctx, cur)
				})
				if err != nil {
					return fmt.Errorf("moving NodeMaintenance %s to Complete: %w", nm.Name, err)
				}
				return nil
			}
			return end, complete, nil
		}
		if ctx.Err() != nil {
			return 0, nil, ctx.Err()
		}
		sleep(ctx, 50*time.Millisecond)
	}
}

// untilWritten retries write while it fails with a conflict or an API
// server that does not answer (for up to 5 minutes); any other error ends
// it at once.
func untilWritten(ctx context.Context, write func(context.Context) error) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		last = write(ctx)
		if last != nil && !transient(last) {
			return false, last
		}
		return last == nil, nil
	})
	if err != nil && last != nil && !errors.Is(err, last) {
		return fmt.Errorf("%w (last error: %w)", err, last)
	}
	return err
}

// transient says whether a request may succeed if made again: a conflict,
// or an API server that is away, busy or timing out.
func transient(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsTooManyRequests(err) || apierrors.IsInternalError(err) ||
		utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) ||
		errors.Is(err, io.ErrUnexpectedEOF) || isNetTimeout(err)
}

func isNetTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// baselineDrain cordons and drains with kubectl's drain library.
func (s *scenario) baselineDrain(ctx context.Context, ns, node string, since func() time.Duration, m *Markers) (time.Duration, func(context.Context) error, error) {
	h := &drain.Helper{
		Ctx: ctx, Client: s.c.Client, Force: true, IgnoreAllDaemonSets: true, DeleteEmptyDirData: true,
		GracePeriodSeconds: -1, Timeout: 3 * time.Minute, Out: nopWriter{}, ErrOut: os.Stderr,
		OnPodDeletionOrEvictionStarted: func(*corev1.Pod, bool) {
			if m.FirstEviction == 0 {
				m.FirstEviction = since()
			}
		},
	}
	n, err := s.c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return 0, nil, err
	}
	s.step("baseline: kubectl drain %s (cordon, evict every pod)", node)
	if err := drain.RunCordonOrUncordon(h, n, true); err != nil {
		return 0, nil, fmt.Errorf("cordoning %s: %w", node, err)
	}
	s.drainStarted(ctx, node)
	if err := drain.RunNodeDrain(h, node); err != nil {
		return 0, nil, fmt.Errorf("draining %s: %w", node, err)
	}
	end := since()
	s.step("baseline: %s drained in %.1fs", node, (end - m.Drain).Seconds())
	complete := func(ctx context.Context) error {
		n, err := s.c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		h.Ctx = ctx
		return drain.RunCordonOrUncordon(h, n, false)
	}
	return end, complete, nil
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }

func newClient(c *localcluster.Cluster) (client.Client, error) {
	return client.New(c.Config, client.Options{Scheme: Scheme()})
}

// longLived keeps n long-lived connections open, each for lifetime, then
// replaces it; it counts those that broke.
type longLived struct {
	done           chan struct{}
	wg             sync.WaitGroup
	resets, opened atomic.Int64
	// lastBreak says why the last connection broke, and when.
	lastBreak atomic.Pointer[string]
}

func (l *longLived) broke(why string) {
	l.resets.Add(1)
	msg := time.Now().Format("15:04:05.000") + ": " + why
	l.lastBreak.Store(&msg)
}

// lastBroken is why the last connection broke ("" if none did).
func (l *longLived) lastBroken() string {
	if p := l.lastBreak.Load(); p != nil {
		return *p
	}
	return ""
}

func startLongLived(dial func(ctx context.Context, network, addr string) (net.Conn, error), open openLongLivedFunc, addr string, n int, lifetime time.Duration) *longLived {
	l := &longLived{done: make(chan struct{})}
	for i := range n {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			// Stagger the starts so that replacements spread out.
			select {
			case <-l.done:
				return
			case <-time.After(lifetime * time.Duration(i) / time.Duration(max(n, 1))):
			}
			for {
				conn, err := open(dial, addr, 200*time.Millisecond)
				if err != nil {
					l.broke("opening: " + err.Error())
				} else {
					l.opened.Add(1)
				}
				select {
				case <-l.done:
					if conn != nil {
						conn.Close()
					}
					return
				case <-time.After(lifetime):
				}
				if conn != nil {
					if why := conn.Broken(); why != "" {
						l.broke(why)
					}
					conn.Close()
				}
			}
		}()
	}
	return l
}

// openLongLivedFunc opens one long-lived connection (appKind.openLongLived).
type openLongLivedFunc func(dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string, interval time.Duration) (*loadgen.LongLived, error)

func (l *longLived) stop() {
	close(l.done)
	l.wg.Wait()
}

// p99 is the 99th percentile latency of the requests sent in [from, to),
// failures counted at their timeout.
func p99(samples []loadgen.Sample, from, to time.Duration) float64 {
	var lat []time.Duration
	for _, s := range samples {
		if s.At >= from && s.At < to {
			lat = append(lat, s.Latency)
		}
	}
	return float64(stats.Percentile(lat, 0.99).Microseconds()) / 1000
}
