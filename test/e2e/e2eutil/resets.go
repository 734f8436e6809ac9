package e2eutil

import (
	"context"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// Resets records the TCP resets the hosts of a cluster's network send
// each other (network.RSTTap), for a test that saw a connection reset to
// say which host sent it.
type Resets struct {
	tap  *network.RSTTap
	net  *network.Network
	from time.Time
}

// WatchResets starts recording resets; it stops with ctx. A tap that
// cannot start is logged, and Log then says so.
func WatchResets(t *testing.T, ctx context.Context, c *localcluster.Cluster) *Resets {
	t.Helper()
	tap, err := c.Network.TapRSTs(ctx)
	if err != nil {
		t.Logf("not watching resets: %v", err)
	}
	return &Resets{tap: tap, net: c.Network, from: time.Now()}
}

// Log writes how many resets each host sent since WatchResets, then the
// resets seen within a second of any of near (a failure's moments; none:
// from the start), the first 40, each with the host that sent it. A reset
// the router forwards comes from a client behind it: one sent to a node's
// address rather than to a load-balancer address refuses a reply that
// came back untranslated.
func (r *Resets) Log(t *testing.T, near ...time.Time) {
	t.Helper()
	if r.tap == nil {
		return
	}
	seen, missed := r.tap.Since(r.from)
	hosts := r.net.HostsByMAC()
	senders := map[string]int{}
	var shown []network.RST
	for _, rst := range seen {
		senders[hosts[rst.From.String()]]++
		if len(near) == 0 || closeTo(rst.At, near, time.Second) {
			shown = append(shown, rst)
		}
	}
	t.Logf("%d TCP reset(s) crossed the node network since %s (%d more not kept); by sender: %v", len(seen), r.from.UTC().Format("15:04:05.000"), missed, senders)
	if len(near) > 0 {
		t.Logf("%d of them within 1s of a failure (%d failure moment(s))", len(shown), len(near))
	}
	for i, rst := range shown {
		if i == 40 {
			t.Logf("... and %d more", len(shown)-i)
			break
		}
		t.Logf("  reset %s, sent by %q", rst, hosts[rst.From.String()])
	}
}

// closeTo reports whether at is within d of any of times.
func closeTo(at time.Time, times []time.Time, d time.Duration) bool {
	for _, t := range times {
		if diff := at.Sub(t); diff >= -d && diff <= d {
			return true
		}
	}
	return false
}
