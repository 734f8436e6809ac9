package demo

import (
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/loadgen"
)

func TestSlowRequests(t *testing.T) {
	s := time.Second
	markers := Markers{Drain: 3 * s, FirstEviction: 5 * s, Drained: 10 * s, NodeDown: 11 * s, NodeUp: 26 * s}
	noEviction := markers
	noEviction.FirstEviction = 0
	cases := []struct {
		name    string
		markers Markers
		samples []loadgen.Sample
		want    string
	}{
		{"none slow", markers, []loadgen.Sample{{At: 4 * s, Latency: 10 * time.Millisecond, Node: "node-2"}}, ""},
		{"failures are not slow", markers, []loadgen.Sample{{At: 4 * s, Latency: 3 * s, Failed: true}}, ""},
		{"by phase, node and second", markers, []loadgen.Sample{
			{At: 6*s + 100*time.Millisecond, Latency: 1010 * time.Millisecond, Node: "node-2"},
			{At: 6*s + 900*time.Millisecond, Latency: 1020 * time.Millisecond, Node: "node-3"},
			{At: 12 * s, Latency: 3 * s, Node: "node-2"},
			{At: 12 * s, Latency: 999 * time.Millisecond, Node: "node-2"},
		}, "3 of 4 requests took 1s or more: from the first eviction 2, while the node was down 1; served by node-2 2, node-3 1; busiest seconds 6s: 2, 12s: 1"},
		{"a moment not recorded", noEviction, []loadgen.Sample{
			{At: 6 * s, Latency: 2 * s, Node: "node-2"},
		}, "1 of 1 requests took 1s or more: from the drain 1; served by node-2 1; busiest seconds 6s: 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := &Result{Markers: c.markers, Samples: c.samples}
			if got := res.SlowRequests(); got != c.want {
				t.Errorf("got  %q\nwant %q", got, c.want)
			}
		})
	}
}
