package dataplane

import (
	"fmt"
	"os"
	"strings"
)

// The source ports of the eBPF path's translated flows (bpf/ebb_lb.c,
// snat_port): below the node ports, and above the host's ephemeral ports
// as Linux sets them by default (32768 to 60999).
var bpfSourcePorts = [][2]int{{1024, 29999}, {61000, 65535}}

// warnIfEphemeralPortsOverlap logs a warning when the host's ephemeral
// ports (net.ipv4.ip_local_port_range) overlap the flows' source ports: a
// connection of the host's own (a probe) could then use a port a flow
// uses toward the same backend, and its replies would go to the flow's
// client. Only the process's own network namespace is read (/proc/sys/net
// is the reader's).
func (e *ebpfPath) warnIfEphemeralPortsOverlap() {
	if e.netns != 0 {
		return
	}
	raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return
	}
	lo, hi, ok := parsePortRange(string(raw))
	if !ok {
		return
	}
	if overlap := portsOverlap(lo, hi); overlap != "" {
		e.log.Info("Warning: the host's ephemeral ports overlap the eBPF kernel path's source ports; a connection of this host's own could have its replies taken for a flow's. Narrow net.ipv4.ip_local_port_range to 32768-60999 (the default) or reserve the overlap with net.ipv4.ip_local_reserved_ports",
			"ip_local_port_range", fmt.Sprintf("%d-%d", lo, hi), "overlap", overlap)
	}
}

// parsePortRange reads ip_local_port_range's "low high".
func parsePortRange(s string) (lo, hi int, ok bool) {
	if _, err := fmt.Sscan(strings.TrimSpace(s), &lo, &hi); err != nil || lo > hi {
		return 0, 0, false
	}
	return lo, hi, true
}

// portsOverlap says which of the source ports the range lo-hi covers, or
// "" for none.
func portsOverlap(lo, hi int) string {
	var parts []string
	for _, r := range bpfSourcePorts {
		if from, to := max(lo, r[0]), min(hi, r[1]); from <= to {
			parts = append(parts, fmt.Sprintf("%d-%d", from, to))
		}
	}
	return strings.Join(parts, ",")
}
