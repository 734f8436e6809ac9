package bgp

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParsePeer(t *testing.T) {
	tests := []struct {
		in      string
		want    Peer
		wantErr string
	}{
		{in: "10.0.0.253:64500", want: Peer{Address: netip.MustParseAddr("10.0.0.253"), ASN: 64500}},
		{in: "[fd00::1]:4200000000", want: Peer{Address: netip.MustParseAddr("fd00::1"), ASN: 4200000000}},
		{in: "10.0.0.253", wantErr: "want ADDRESS:ASN"},
		{in: "router:64500", wantErr: "is not an IP address"},
		{in: "10.0.0.253:0", wantErr: "is not an AS number"},
		{in: "10.0.0.253:4294967296", wantErr: "is not an AS number"},
	}
	for _, tt := range tests {
		got, err := ParsePeer(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParsePeer(%q) = %v, %v; want an error with %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParsePeer(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}
