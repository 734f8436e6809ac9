package demo

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// SlowThreshold is the latency from which a request counts as slow: a
// lost first SYN costs a second (Linux's initial retransmission timeout),
// far above any answer on this network.
const SlowThreshold = time.Second

// SlowRequests says where the requests that answered but took
// SlowThreshold or more were: how many in each moment of the scenario,
// which node served them, and the seconds (from the start of the traffic)
// that had the most; "" when none was slow. It is for finding where a
// high p99 comes from.
func (res *Result) SlowRequests() string {
	phases := res.phases()
	inPhase := make([]int, len(phases))
	byNode := map[string]int{}
	bySecond := map[int]int{}
	slow := 0
	for _, s := range res.Samples {
		if s.Failed || s.Latency < SlowThreshold {
			continue
		}
		slow++
		for i := len(phases) - 1; i >= 0; i-- {
			if s.At >= phases[i].from {
				inPhase[i]++
				break
			}
		}
		byNode[s.Node]++
		bySecond[int(s.At/time.Second)]++
	}
	if slow == 0 {
		return ""
	}
	var parts []string
	for i, p := range phases {
		if inPhase[i] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", p.name, inPhase[i]))
		}
	}
	return fmt.Sprintf("%d of %d requests took %s or more: %s; served by %s; busiest seconds %s",
		slow, len(res.Samples), SlowThreshold, strings.Join(parts, ", "), counts(byNode), busiest(bySecond, 5))
}

// phase is a moment of the scenario, from its start to the next one's.
type phase struct {
	name string
	from time.Duration
}

// phases are the scenario's moments in order. A marker that was not
// recorded (zero, as the first eviction is when no pod was evicted) or
// that comes before the one it should follow is left out, so that its
// requests count for the moment before it.
func (res *Result) phases() []phase {
	m := res.Markers
	all := []phase{
		{"from the drain", m.Drain},
		{"from the first eviction", m.FirstEviction},
		{"from drained", m.Drained},
		{"while the node was down", m.NodeDown},
		{"after it was back", m.NodeUp},
	}
	out := []phase{{"before the drain", 0}}
	for _, p := range all {
		if p.from > 0 && p.from >= out[len(out)-1].from {
			out = append(out, p)
		}
	}
	return out
}

// counts prints a map's entries in key order.
func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// busiest prints the n seconds with the most slow requests, most first.
func busiest(bySecond map[int]int, n int) string {
	secs := make([]int, 0, len(bySecond))
	for s := range bySecond {
		secs = append(secs, s)
	}
	sort.Slice(secs, func(i, j int) bool {
		if bySecond[secs[i]] != bySecond[secs[j]] {
			return bySecond[secs[i]] > bySecond[secs[j]]
		}
		return secs[i] < secs[j]
	})
	var parts []string
	for _, s := range secs[:min(n, len(secs))] {
		parts = append(parts, fmt.Sprintf("%ds: %d", s, bySecond[s]))
	}
	return strings.Join(parts, ", ")
}
