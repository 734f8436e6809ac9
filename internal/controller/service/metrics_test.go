package service

import (
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ebbdev/ebb/internal/addrrange"
)

// Each pool's addresses are exported by family and state, as its status
// counts them, and follow the allocations: a dual-stack pool with two
// IPv4 addresses and four IPv6 ones, one IPv4 address given out, then
// the second (the pool's IPv4 half exhausted: available 0).
func TestPoolMetricsFollowTheAllocations(t *testing.T) {
	a, err := NewAllocator(nil)
	if err != nil {
		t.Fatal(err)
	}
	v4, err := addrrange.Parse("10.96.250.1-10.96.250.2")
	if err != nil {
		t.Fatal(err)
	}
	v6, err := addrrange.Parse("fd00:96::/126")
	if err != nil {
		t.Fatal(err)
	}
	a.SetPools([]Pool{{Name: "edge", Ranges: []addrrange.Range{v4, v6}, AutoAssign: true}})
	reg := prometheus.NewRegistry()
	if _, err := NewMetrics(reg, a); err != nil {
		t.Fatal(err)
	}
	want := func(v4Assigned, v4Available int) string {
		return strings.NewReplacer("A4", strconv.Itoa(v4Assigned), "F4", strconv.Itoa(v4Available)).Replace(`
# HELP ebb_addresspool_addresses Addresses of each address pool (the AddressPools, and --vip-pool's) by family and state: assigned to Services, or available; a family the pool has no address of has no series.
# TYPE ebb_addresspool_addresses gauge
ebb_addresspool_addresses{family="IPv4",pool="edge",state="assigned"} A4
ebb_addresspool_addresses{family="IPv4",pool="edge",state="available"} F4
ebb_addresspool_addresses{family="IPv6",pool="edge",state="assigned"} 0
ebb_addresspool_addresses{family="IPv6",pool="edge",state="available"} 4
`)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(0, 2)), "ebb_addresspool_addresses"); err != nil {
		t.Error(err)
	}
	for i, name := range []string{"a", "b"} {
		if _, err := a.Allocate(Holder{Service: types.NamespacedName{Namespace: "ns", Name: name}}, false); err != nil {
			t.Fatal(err)
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want(i+1, 1-i)), "ebb_addresspool_addresses"); err != nil {
			t.Errorf("after %d allocations: %v", i+1, err)
		}
	}
}
