package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// TestUntrackDirectKeepsTheDirectFlowsOutOfConntrack runs connections to
// a backend on a host where a NAT table has turned conntrack on (as the
// kernel engine's does): tracked without the untracked table, not tracked
// with it, the state the direct slices of the kernel engine run in.
func TestUntrackDirectKeepsTheDirectFlowsOutOfConntrack(t *testing.T) {
	host, err := network.NewHost("ebb-bench-test-ct")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	topo := &topology{lb: host}
	conntrackOn, err := toggledTable(topo, conntrackTable, addConntrackTable)
	if err != nil {
		t.Fatal(err)
	}
	if err := conntrackOn(true); err != nil {
		t.Fatal(err)
	}
	ln, err := host.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	untrack, err := untrackDirect(topo, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name        string
		load        bool // untrack(load): false puts the untracked table in place
		wantTracked bool
	}{
		{"the contender's slices: tracked", true, true},
		{"the direct slices: untracked", false, false},
	} {
		if err := untrack(tc.load); err != nil {
			t.Fatal(err)
		}
		before := conntrackCount(t, host)
		for range 5 {
			err := host.Do(func() error {
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					return err
				}
				return c.Close()
			})
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
		if tracked := conntrackCount(t, host) > before; tracked != tc.wantTracked {
			t.Errorf("%s: new conntrack entries %t, want %t", tc.name, tracked, tc.wantTracked)
		}
	}
}

// conntrackCount is the number of conntrack entries on host.
func conntrackCount(t *testing.T, host *network.Host) int {
	t.Helper()
	var n int
	err := host.Do(func() error {
		b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count")
		if err != nil {
			return err
		}
		n, err = strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return fmt.Errorf("reading the conntrack count: %w", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
