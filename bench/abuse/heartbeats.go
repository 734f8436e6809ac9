package main

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"

	"github.com/ebbdev/ebb/internal/announce/l2"
)

// writeKeyDir writes the L2 heartbeat key ebb lb signs with, laid out as a
// mounted Secret (--l2-key-dir).
func writeKeyDir(dir string) (string, error) {
	keys := filepath.Join(dir, "l2-keys")
	if err := os.MkdirAll(keys, 0o700); err != nil {
		return "", err
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return "", err
	}
	return keys, os.WriteFile(filepath.Join(keys, "key-1"), key, 0o600)
}

// forgeResult is what a flood of forged heartbeats did.
type forgeResult struct {
	sent                     int
	refused, accepted, owned float64
	peers                    float64
	lbCPUCores, idleCPUCores float64
}

// idleFor is how long ebb lb's idle CPU is measured.
const idleFor = 3 * time.Second

// forgeHeartbeats sends forged heartbeats from the client's eth0 (on the
// LB host's announcing segment) as fast as one socket can for d: by turns
// an unsigned one in the format before signing (version 1), and one in the
// current format with the real key's ID and a MAC of random bytes. Each
// claims the frontends' address for a replica of ebb lb's group. It
// returns what ebb lb's metrics say of them after.
func forgeHeartbeats(h *hosts, pid int, d time.Duration) (forgeResult, error) {
	var r forgeResult
	// ebb lb's CPU with nothing sent (the UDP flood's flows expire first).
	time.Sleep(6 * time.Second)
	cpu := cpuSeconds(pid)
	time.Sleep(idleFor)
	r.idleCPUCores = (cpuSeconds(pid) - cpu) / idleFor.Seconds()
	before := lbMetrics(h.lb)
	cpu = cpuSeconds(pid)
	err := h.client.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		c, err := packet.Listen(ifi, packet.Datagram, l2.EtherType, nil)
		if err != nil {
			return fmt.Errorf("opening a packet socket on the client: %w", err)
		}
		defer c.Close()
		vip := netip.MustParseAddr("10.78.9.1")
		frames := [][]byte{unsignedHeartbeat("forger", vip), badlySignedHeartbeat("forger", vip)}
		to := &packet.Addr{HardwareAddr: ethernet.Broadcast}
		for start := time.Now(); time.Since(start) < d; {
			for i := 0; i < 1000; i++ {
				if _, err := c.WriteTo(frames[r.sent%2], to); err != nil {
					return fmt.Errorf("sending a forged heartbeat: %w", err)
				}
				r.sent++
			}
		}
		return nil
	})
	if err != nil {
		return r, err
	}
	r.lbCPUCores = (cpuSeconds(pid) - cpu) / d.Seconds()
	time.Sleep(time.Second) // the last frames read, an election or more run
	after := lbMetrics(h.lb)
	r.refused = metricSum(after, "ebb_lb_l2_heartbeats_refused_total") - metricSum(before, "ebb_lb_l2_heartbeats_refused_total")
	r.accepted = metricSum(after, "ebb_lb_l2_heartbeats_accepted_total") - metricSum(before, "ebb_lb_l2_heartbeats_accepted_total")
	r.owned = metricSum(after, "ebb_lb_l2_owned_addresses")
	r.peers = metricSum(after, "ebb_lb_l2_peers")
	return r, nil
}

// heartbeatHead is the start of a heartbeat: magic and version.
func heartbeatHead(version byte) []byte { return []byte{'e', 'b', 'L', '2', version} }

// claim is the body of a heartbeat that offers vip and owns it, as node
// of the group "ebb.dev/l4" (incarnation, seq and gen as given).
func claim(node string, vip netip.Addr, withSeq bool) []byte {
	const group = "ebb.dev/l4"
	b := append([]byte{byte(len(group))}, group...)
	b = append(append(b, byte(len(node))), node...)
	b = binary.BigEndian.AppendUint64(b, uint64(time.Now().UnixNano()))
	if withSeq {
		b = binary.BigEndian.AppendUint64(b, 1<<40)
	}
	b = binary.BigEndian.AppendUint32(b, 1)
	b = append(b, 0, 1, 0, 1, 4|0x80)
	return append(b, vip.AsSlice()...)
}

// unsignedHeartbeat is version 1's frame: what took an address before.
func unsignedHeartbeat(node string, vip netip.Addr) []byte {
	return append(heartbeatHead(1), claim(node, vip, false)...)
}

// badlySignedHeartbeat is the current format naming the real key's ID,
// with a MAC of random bytes.
func badlySignedHeartbeat(node string, vip netip.Addr) []byte {
	b := append(heartbeatHead(2), byte(len("key-1")))
	b = append(append(b, "key-1"...), claim(node, vip, true)...)
	mac := make([]byte, 32)
	_, _ = rand.Read(mac)
	return append(b, mac...)
}
