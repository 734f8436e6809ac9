package dataplane

import "testing"

func TestEphemeralPortsOverlap(t *testing.T) {
	for _, tc := range []struct {
		sysctl, want string
	}{
		{"32768\t60999\n", ""},         // Linux's default
		{"32768 65535", "61000-65535"}, // widened upwards
		{"1024 65535", "1024-29999,61000-65535"},
		{"15000 40000", "15000-29999"},
		{"40000 50000", ""},
	} {
		lo, hi, ok := parsePortRange(tc.sysctl)
		if !ok {
			t.Fatalf("%q not read", tc.sysctl)
		}
		if got := portsOverlap(lo, hi); got != tc.want {
			t.Errorf("%q: overlap %q, want %q", tc.sysctl, got, tc.want)
		}
	}
	if _, _, ok := parsePortRange("60999 32768"); ok {
		t.Error("a reversed range read as valid")
	}
}
