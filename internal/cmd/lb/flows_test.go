package lb

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/lbsync"
)

func TestForwardTargets(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	a := netip.MustParseAddr
	old := lbsync.Peer{Node: "b", Addr: a("10.0.0.2")}                              // joined long ago
	earlier := lbsync.Peer{Node: "c", Addr: a("10.0.0.3"), Joined: t0}              // joined before self
	later := lbsync.Peer{Node: "d", Addr: a("10.0.0.4"), Joined: t0.Add(time.Hour)} // joined after self
	tie := lbsync.Peer{Node: "z", Addr: a("10.0.0.9"), Joined: t0.Add(time.Minute)} // same time, later name
	self := lbsync.Peer{Node: "m", Joined: t0.Add(time.Minute)}
	for _, tc := range []struct {
		name     string
		draining []netip.Addr
		joining  bool
		want     []netip.Addr
	}{
		{"steady: only the draining hosts", []netip.Addr{a("10.0.0.7")}, false, []netip.Addr{a("10.0.0.7")}},
		{"steady, nobody draining: nowhere", nil, false, nil},
		{"joining: the draining hosts and those that joined before", []netip.Addr{a("10.0.0.7")}, true, []netip.Addr{a("10.0.0.7"), a("10.0.0.2"), a("10.0.0.3")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := forwardTargets(tc.draining, []lbsync.Peer{old, earlier, later, tie}, self, tc.joining)
			if !slices.Equal(got, tc.want) {
				t.Errorf("targets %v, want %v", got, tc.want)
			}
		})
	}
	// Two hosts joining at once never forward to each other both ways.
	x, y := lbsync.Peer{Node: "x", Joined: t0}, lbsync.Peer{Node: "y", Joined: t0}
	if x.JoinedBefore(y) == y.JoinedBefore(x) {
		t.Error("JoinedBefore is not a strict order for equal times")
	}
}
