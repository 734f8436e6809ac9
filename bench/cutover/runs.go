package main

import (
	"context"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/ebbdev/ebb/bench/internal/scrape"
	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/loadgen"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// requestTimeout is how long a client waits for an answer before counting
// the request as failed.
const requestTimeout = 3 * time.Second

type bench struct {
	c *localcluster.Cluster
	// lbNode runs ebb; nodes are the app's, which the runs take away.
	lbNode   localcluster.Node
	nodes    []localcluster.Node
	nodePort int32
	load     *loadgen.Requests
	// apiToApplied: from the start of each taint's API write to ebb lb's
	// own timestamp of applying Down. Its parts: write, the API write
	// itself (a GET and an UPDATE, until the response); observedToApplied,
	// ebb lb's own time from its informer's event to Down in effect (the
	// fast path's queue and the data plane). The rest is the watch.
	apiToApplied, write, observedToApplied []time.Duration
}

// cutovers taints each node in turn with out-of-service and measures the
// time to its last accepted new connection.
func (b *bench) cutovers(ctx context.Context, runs int) ([]time.Duration, error) {
	oos := corev1.Taint{Key: lbmodel.TaintOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}
	var out []time.Duration
	for i := range runs {
		node := b.nodes[i%len(b.nodes)].Name
		if err := b.waitServes(ctx, node, time.Now()); err != nil {
			return nil, err
		}
		// The previous run's taint removal must be applied before the
		// sum is read, or its time would count in this run's.
		fastBefore, err := b.settled(ctx, 2*i)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		if err := b.setTaint(ctx, node, &oos); err != nil {
			return nil, err
		}
		b.write = append(b.write, time.Since(t0))
		time.Sleep(time.Second)
		cut := max(b.c.LastNewConnection(node, b.nodePort).Sub(t0), 0)
		out = append(out, cut)
		m, err := b.lbMetrics(ctx, node)
		if err != nil {
			return nil, err
		}
		if !m.exported {
			return nil, fmt.Errorf("run %d: ebb lb exports no ebb_lb_admin_state_applied_timestamp_seconds after the taint", i+1)
		}
		applied, fastAfter := m.applied, m.fastSum
		b.observedToApplied = append(b.observedToApplied, fastAfter-fastBefore)
		if applied.Before(t0) {
			return nil, fmt.Errorf("run %d: ebb lb did not apply Down to node %s within a second of the taint", i+1, node)
		}
		b.apiToApplied = append(b.apiToApplied, applied.Sub(t0))
		if err := b.setTaint(ctx, node, nil); err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "cutover run %d (%s): last new connection %s, Down applied %s after the taint write began (the write took %s, ebb lb's informer event to Down %s)\n",
			i+1, node, cut, applied.Sub(t0), b.write[i], b.observedToApplied[i])
	}
	return out, nil
}

// lbMetrics is what the benchmark reads from `ebb lb`'s metrics.
type lbMetrics struct {
	// applied is when ebb lb last applied Down to the node's backends (its
	// own timestamp; same clock as the bench's: one machine); exported:
	// the metric is there (absent until a first change).
	applied  time.Time
	exported bool
	// fastSum is the sum of the fast path's times from an informer event
	// to the change in effect (one more per change), and transitions how
	// many changes it applied.
	fastSum     time.Duration
	transitions float64
}

func (b *bench) lbMetrics(ctx context.Context, node string) (lbMetrics, error) {
	page, err := ebbrun.LBPage(ctx, b.c, b.lbNode, "/metrics")
	if err != nil {
		return lbMetrics{}, err
	}
	f, err := scrape.Parse(page)
	if err != nil {
		return lbMetrics{}, err
	}
	const applied = "ebb_lb_admin_state_applied_timestamp_seconds"
	_, exported := f[applied]
	sec := scrape.Sum(f, applied, map[string][]string{"node": {node}, "state": {"Down"}})
	return lbMetrics{
		applied:     time.Unix(0, int64(sec*1e9)),
		exported:    exported,
		fastSum:     time.Duration(scrape.HistogramSum(f, "ebb_lb_admin_state_apply_seconds") * float64(time.Second)),
		transitions: scrape.Sum(f, "ebb_lb_admin_state_transitions_total", nil),
	}, nil
}

// settled waits until ebb lb has applied want node changes (each run
// makes two: Down, then back), and returns its fast path's sum of times.
func (b *bench) settled(ctx context.Context, want int) (time.Duration, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, err := b.lbMetrics(ctx, "")
		if err != nil {
			return 0, err
		}
		if m.transitions >= float64(want) {
			return m.fastSum, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("ebb lb applied %.0f node changes, want %d: the last taint removal was not applied within 10 s", m.transitions, want)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// spotRuns announces a spot eviction of each node in turn, kills its data
// path 2 s later, and counts the requests that failed; it also returns the
// time from the kill to the node's last accepted connection (the
// probe-only cutover, when admin state is off).
func (b *bench) spotRuns(ctx context.Context, runs int) (int64, []time.Duration, error) {
	var failed int64
	var cutovers []time.Duration
	for i := range runs {
		node := b.nodes[i%len(b.nodes)].Name
		if err := b.waitServes(ctx, node, time.Now()); err != nil {
			return 0, nil, err
		}
		_, before := b.load.Counts()
		if err := b.c.EmitPreemptScheduled(ctx, node); err != nil {
			return 0, nil, err
		}
		time.Sleep(2 * time.Second)
		killed := time.Now()
		if err := b.c.Disconnect(node); err != nil {
			return 0, nil, err
		}
		// Two probe failures at 5 s intervals, each waiting out its
		// timeout, then the last blackholed requests time out.
		time.Sleep(15*time.Second + requestTimeout)
		_, after := b.load.Counts()
		cut := max(b.c.LastNewConnection(node, b.nodePort).Sub(killed), 0)
		cutovers = append(cutovers, cut)
		failed += after - before
		fmt.Fprintf(os.Stderr, "spot run %d (%s): %d failed requests, last connection %s after the kill\n", i+1, node, after-before, cut.Round(time.Millisecond))
		if err := b.c.Reconnect(node); err != nil {
			return 0, nil, err
		}
		if err := b.setTaint(ctx, node, nil); err != nil {
			return 0, nil, err
		}
	}
	return failed, cutovers, nil
}

// setTaint replaces the node's leaving taints with taint (nil: none).
func (b *bench) setTaint(ctx context.Context, name string, taint *corev1.Taint) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := b.c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var taints []corev1.Taint
		for _, t := range n.Spec.Taints {
			if t.Key != lbmodel.TaintOutOfService && t.Key != lbmodel.TaintDraining {
				taints = append(taints, t)
			}
		}
		if taint != nil {
			taints = append(taints, *taint)
		}
		n.Spec.Taints = taints
		_, err = b.c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// waitServes waits until node accepts a connection after since: it is in
// rotation again.
func (b *bench) waitServes(ctx context.Context, node string, since time.Time) error {
	deadline := time.Now().Add(time.Minute)
	for !b.c.LastNewConnection(node, b.nodePort).After(since) {
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s took no new connection for a minute", node)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

func (b *bench) waitAllNodesServe(ctx context.Context) error {
	since := time.Now()
	for _, n := range b.nodes {
		if err := b.waitServes(ctx, n.Name, since); err != nil {
			return err
		}
	}
	return nil
}
