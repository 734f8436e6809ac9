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

// Log writes the resets seen since WatchResets (the first 20), each with
// the host that sent it.
func (r *Resets) Log(t *testing.T) {
	t.Helper()
	if r.tap == nil {
		return
	}
	seen, missed := r.tap.Since(r.from)
	t.Logf("%d TCP reset(s) crossed the node network since %s (%d more not kept)", len(seen), r.from.UTC().Format("15:04:05.000"), missed)
	for i, rst := range seen {
		if i == 20 {
			t.Logf("... and %d more", len(seen)-i)
			break
		}
		t.Logf("  reset %s, sent by %q", rst, r.net.HostWithMAC(rst.From))
	}
}
