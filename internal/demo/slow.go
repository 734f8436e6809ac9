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
	m := res.Markers
	phases := []struct {
		name     string
		from, to time.Duration
	}{
		{"before the drain", 0, m.Drain},
		{"drain to first eviction", m.Drain, m.FirstEviction},
		{"first eviction to drained", m.FirstEviction, m.Drained},
		{"drained to node down", m.Drained, m.NodeDown},
		{"node down", m.NodeDown, m.NodeUp},
		{"after", m.NodeUp, time.Duration(1<<63 - 1)},
	}
	inPhase := make([]int, len(phases))
	byNode := map[string]int{}
	bySecond := map[int]int{}
	slow := 0
	for _, s := range res.Samples {
		if s.Failed || s.Latency < SlowThreshold {
			continue
		}
		slow++
		for i, p := range phases {
			if s.At >= p.from && s.At < p.to {
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
