package localcluster

import (
	"net/netip"
	"reflect"
	"testing"
)

// FRR 8.4's `show bgp ipv4 unicast PREFIX json`, cut to the fields read:
// one eBGP path with communities, one iBGP path with a local preference.
func TestParseBGPPaths(t *testing.T) {
	out := []byte(`{"prefix":"10.96.240.1/32","paths":[
	 {"aspath":{"string":"64512"},"community":{"string":"64512:100 no-export","list":["64512:100","noExport"]},
	  "largeCommunity":{"string":"4200000000:1:2","list":["4200000000:1:2"]},"nexthops":[{"ip":"10.0.0.1","afi":"ipv4","used":true}]},
	 {"aspath":{"string":""},"locPrf":250,"nexthops":[{"ip":"10.0.0.2","afi":"ipv4"}]}]}`)
	got, err := parseBGPPaths(out)
	if err != nil {
		t.Fatal(err)
	}
	lp := uint32(250)
	want := []BGPPath{
		{NextHop: netip.MustParseAddr("10.0.0.1"), Communities: []string{"64512:100", "no-export"}, LargeCommunities: []string{"4200000000:1:2"}},
		{NextHop: netip.MustParseAddr("10.0.0.2"), LocalPreference: &lp},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parsed %+v, want %+v", got, want)
	}
	if _, err := parseBGPPaths([]byte("% Network not in table")); err == nil {
		t.Error("FRR's refusal parsed as paths")
	}
}

// FRR 8.4's `show bgp neighbors ADDRESS json`, cut to the fields read: a
// speaker that restarted keeping IPv4's forwarding state and not IPv6's;
// a neighbour FRR does not know is an error.
func TestParseGracefulRestart(t *testing.T) {
	n := netip.MustParseAddr("10.0.0.1")
	out := []byte(`{"10.0.0.1":{"remoteAs":64512,"bgpState":"Established","gracefulRestartInfo":{"localGrMode":"Helper*","remoteGrMode":"Restart","rBit":true,"nBit":false,
	  "timers":{"configuredRestartTimer":120,"receivedRestartTimer":15},
	  "ipv4Unicast":{"fBit":true,"endOfRibStatus":{"endOfRibRecv":true}},"ipv6Unicast":{"fBit":false}}}}`)
	got, err := parseGracefulRestart(out, n)
	if err != nil {
		t.Fatal(err)
	}
	want := GracefulRestart{Established: true, Restarted: true, ForwardingKept: map[string]bool{"ipv4Unicast": true, "ipv6Unicast": false}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parsed %+v, want %+v", got, want)
	}
	if _, err := parseGracefulRestart([]byte(`{"bgpNoSuchNeighbor":true}`), n); err == nil {
		t.Error("an unknown neighbour parsed")
	}
}
