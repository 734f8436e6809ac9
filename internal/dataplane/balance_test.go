package dataplane

import (
	"fmt"
	"math"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func testSet(t *testing.T, balancing Balancing, weights ...int) *backendSet {
	t.Helper()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var bs []*backend
	cfg := Frontend{Name: "fe", Balancing: balancing}
	for i, w := range weights {
		b := Backend{Address: fmt.Sprintf("10.0.0.%d", i+1), Port: 30000, Weight: w}
		cfg.Backends = append(cfg.Backends, b)
		bs = append(bs, newBackend(b, m.forBackend("fe", b), toAdminState(b.AdminState)))
	}
	return newBackendSet(cfg, bs, nil)
}

func clientAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{192, 0, byte(i >> 8), byte(i)})
}

// ClientIP balancing keeps a client on its backend, spreads clients evenly,
// and when a backend leaves moves only that backend's clients.
func TestClientIPMovesOnlyTheLeavingBackendsClients(t *testing.T) {
	s := testSet(t, ClientIP, 1, 1, 1, 1, 1)
	const clients = 5000
	before := make([]*backend, clients)
	share := map[*backend]int{}
	for i := range clients {
		before[i] = s.choose(clientAddr(i), nil)
		share[before[i]]++
		if again := s.choose(clientAddr(i), nil); again != before[i] {
			t.Fatalf("client %d moved without a change", i)
		}
	}
	for b, n := range share {
		if math.Abs(float64(n)-clients/5) > clients/5*0.15 {
			t.Errorf("backend %s has %d of %d clients; want about %d", b.addr, n, clients, clients/5)
		}
	}
	leaving := s.backends[2]
	leaving.admin.Store(int32(adminDown))
	moved := 0
	for i := range clients {
		after := s.choose(clientAddr(i), nil)
		if after == leaving {
			t.Fatalf("client %d still goes to the Down backend", i)
		}
		if after != before[i] {
			moved++
			if before[i] != leaving {
				t.Fatalf("client %d moved from %s, which did not change", i, before[i].addr)
			}
		}
	}
	if moved != share[leaving] {
		t.Errorf("%d clients moved, want exactly the %d of the leaving backend", moved, share[leaving])
	}
	// Two replicas build the same table.
	if other := testSet(t, ClientIP, 1, 1, 1, 1, 1); fmt.Sprint(other.maglev[:64]) != fmt.Sprint(s.maglev[:64]) {
		t.Error("two builds of the same backends differ")
	}
}

func TestRoundRobinFollowsWeights(t *testing.T) {
	tests := []struct {
		weights []int
		want    []int
	}{
		{[]int{1, 1, 1}, []int{100, 100, 100}},
		{[]int{3, 1}, []int{150, 50}},
		{[]int{1, 2, 1}, []int{50, 100, 50}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.weights), func(t *testing.T) {
			s := testSet(t, RoundRobin, tt.weights...)
			got := map[*backend]int{}
			total := 0
			for _, w := range tt.want {
				total += w
			}
			for range total {
				got[s.choose(netip.Addr{}, nil)]++
			}
			for i, b := range s.backends {
				if got[b] != tt.want[i] {
					t.Errorf("backend %d (weight %d) got %d of %d, want %d", i, tt.weights[i], got[b], total, tt.want[i])
				}
			}
		})
	}
}

func TestChooseSkipsTriedAndIneligible(t *testing.T) {
	for _, bal := range []Balancing{RoundRobin, LeastConnections, ClientIP} {
		t.Run(string(bal), func(t *testing.T) {
			s := testSet(t, bal, 1, 1, 1)
			s.backends[0].admin.Store(int32(adminDown))
			first := s.choose(clientAddr(1), nil)
			second := s.choose(clientAddr(1), []*backend{first})
			if first == s.backends[0] || second == s.backends[0] || second == first || second == nil {
				t.Fatalf("first %v, second %v", first, second)
			}
			if third := s.choose(clientAddr(1), []*backend{first, second}); third != nil {
				t.Errorf("with every eligible backend tried, got %s", third.addr)
			}
		})
	}
}
