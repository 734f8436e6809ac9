package addrrange

import (
	"math"
	"net/netip"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in       string
		from, to string
		size     int64
	}{
		{"10.96.255.0/24", "10.96.255.1", "10.96.255.254", 254},
		{"10.96.255.0/30", "10.96.255.0", "10.96.255.3", 4},
		{"10.96.255.7/30", "10.96.255.4", "10.96.255.7", 4},
		{"10.96.240.10-10.96.240.20", "10.96.240.10", "10.96.240.20", 11},
		{" fd00:96::/120 ", "fd00:96::", "fd00:96::ff", 256},
		{"fd00::/64", "fd00::", "fd00::ffff:ffff:ffff:ffff", math.MaxInt64},
	}
	for _, tt := range tests {
		r, err := Parse(tt.in)
		if err != nil {
			t.Fatalf("%q: %v", tt.in, err)
		}
		if r.From.String() != tt.from || r.To.String() != tt.to || r.Size() != tt.size {
			t.Errorf("%q: %s-%s (%d), want %s-%s (%d)", tt.in, r.From, r.To, r.Size(), tt.from, tt.to, tt.size)
		}
	}
	for _, bad := range []string{"10.96.255.0", "10.0.0.9-10.0.0.1", "10.0.0.1-fd00::1", "a-b", ""} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestContains(t *testing.T) {
	r, err := Parse("10.96.240.10-10.96.240.20")
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]bool{"10.96.240.10": true, "10.96.240.20": true, "10.96.240.9": false, "10.96.240.21": false, "::ffff:10.96.240.15": false, "fd00::1": false} {
		if got := r.Contains(netip.MustParseAddr(in)); got != want {
			t.Errorf("Contains(%s) = %v, want %v", in, got, want)
		}
	}
}
