package localcluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// kwok renews a node's Lease every 10 s (a quarter of its 40 s duration).
// A Lease older than heartbeatLapse has missed at least two renewals; past
// --node-monitor-grace-period (2m) the node lifecycle controller marks the
// node NotReady and its pods unready, and traffic to them fails. CI saw
// that mid-suite (NodeNotReady for two nodes at once) while kwok kept no
// Leases at all (see nodeLeaseSeconds); so that a lapse never goes unseen
// again, the local cluster reports every one as it happens, with what kwok
// logged about leases.
const (
	heartbeatLapse = 30 * time.Second
	heartbeatPoll  = 5 * time.Second
)

// heartbeatWatch tracks the nodes whose heartbeats have lapsed.
type heartbeatWatch struct {
	// lapsed maps a node to the renew time its lapse started from.
	lapsed map[string]time.Time
}

// heartbeatChange is a lapse that started or ended.
type heartbeatChange struct {
	node    string
	renewed time.Time // the last renewal before the lapse
	started bool      // a lapse started (else one ended)
}

// observe compares the Leases with the lapses already known at now and
// returns what changed, sorted by node.
func (w *heartbeatWatch) observe(leases []coordinationv1.Lease, now time.Time) []heartbeatChange {
	var changes []heartbeatChange
	seen := map[string]bool{}
	for _, l := range leases {
		if l.Spec.RenewTime == nil {
			continue
		}
		node, renewed := l.Name, l.Spec.RenewTime.Time
		seen[node] = true
		from, known := w.lapsed[node]
		switch stale := now.Sub(renewed) > heartbeatLapse; {
		case stale && !known:
			w.lapsed[node] = renewed
			changes = append(changes, heartbeatChange{node: node, renewed: renewed, started: true})
		case !stale && known:
			delete(w.lapsed, node)
			changes = append(changes, heartbeatChange{node: node, renewed: from})
		}
	}
	for node := range w.lapsed {
		if !seen[node] { // the node and its Lease were deleted
			delete(w.lapsed, node)
		}
	}
	slices.SortFunc(changes, func(a, b heartbeatChange) int { return strings.Compare(a.node, b.node) })
	return changes
}

// watchHeartbeats polls the nodes' Leases until ctx ends and writes to out
// each lapse as it starts (with kwok's last log lines about leases, from
// kwokLog) and as it ends.
func watchHeartbeats(ctx context.Context, client kubernetes.Interface, clk clock.WithTicker, out io.Writer, kwokLog string) {
	w := &heartbeatWatch{lapsed: map[string]time.Time{}}
	t := clk.NewTicker(heartbeatPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		list, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).List(ctx, metav1.ListOptions{})
		if err != nil {
			continue // the apiserver is busy or stopping; the next poll sees
		}
		now := clk.Now()
		for _, c := range w.observe(list.Items, now) {
			if c.started {
				fmt.Fprintf(out, "[cluster] %s: node %s's heartbeats lapsed: its Lease was last renewed at %s (%s ago); the node goes NotReady %s after that. kwok's last lines about leases:\n%s",
					now.UTC().Format(time.TimeOnly), c.node, c.renewed.UTC().Format(time.TimeOnly), now.Sub(c.renewed).Round(time.Second), nodeMonitorGracePeriod, leaseLogLines(kwokLog, 8))
			} else {
				fmt.Fprintf(out, "[cluster] %s: node %s's heartbeats are back, after %s without\n",
					now.UTC().Format(time.TimeOnly), c.node, now.Sub(c.renewed).Round(time.Second))
			}
		}
	}
}

// leaseLogLines is the last n lines of path that mention leases, each
// indented, or a line saying there are none.
func leaseLogLines(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return "    (" + err.Error() + ")\n"
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if strings.Contains(strings.ToLower(sc.Text()), "lease") {
			lines = append(lines, sc.Text())
			if len(lines) > n {
				lines = lines[1:]
			}
		}
	}
	if len(lines) == 0 {
		return "    (none)\n"
	}
	return "    " + strings.Join(lines, "\n    ") + "\n"
}
