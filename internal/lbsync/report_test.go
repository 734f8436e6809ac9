package lbsync

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	"github.com/ebbdev/ebb/internal/dataplane"
)

func TestNodeTrafficAndUrgency(t *testing.T) {
	addr := netip.MustParseAddrPort("10.0.0.1:30080")
	status := []dataplane.BackendStatus{
		{Frontend: "a", Address: addr, Owner: "n1", AdminState: dataplane.AdminDown, Active: 3},
		{Frontend: "b", Address: addr, Owner: "n1", AdminState: dataplane.AdminDown, Active: 2},
		{Frontend: "a", Address: addr, Owner: "n2", AdminState: dataplane.AdminNone, Active: 7},
		{Frontend: "static", Address: addr, Active: 1}, // no owner: not a node
	}
	got := NodeTraffic(status)
	want := []v1alpha1.NodeTraffic{{Name: "n1", AdminState: "Down", Connections: 5}, {Name: "n2", AdminState: "None", Connections: 7}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got)\n%s", diff)
	}
	tests := []struct {
		name string
		now  []v1alpha1.NodeTraffic
		want bool
	}{
		{"same", want, false},
		{"connections of a node in rotation", []v1alpha1.NodeTraffic{want[0], {Name: "n2", AdminState: "None", Connections: 9}}, false},
		{"connections of a leaving node", []v1alpha1.NodeTraffic{{Name: "n1", AdminState: "Down", Connections: 4}, want[1]}, true},
		{"admin state", []v1alpha1.NodeTraffic{want[0], {Name: "n2", AdminState: "Down", Connections: 7}}, true},
		{"node gone", want[:1], true},
	}
	for _, tt := range tests {
		if got := urgent(want, tt.now); got != tt.want {
			t.Errorf("%s: urgent %v, want %v", tt.name, got, tt.want)
		}
	}
}
