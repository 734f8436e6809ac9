package dataplane

import (
	"fmt"
	"testing"
)

// BenchmarkApplyAdminState sets one backend of every frontend Down or back
// in a configuration of 50 frontends of 10 backends: the cost of the
// apply-to-effect path.
func BenchmarkApplyAdminState(b *testing.B) {
	d, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	cfg := fiftyByTen(func(f int) Frontend {
		return tcpFrontend(fmt.Sprintf("fe-%d", f), freeAddr(&testing.T{}, "tcp"))
	})
	if err := applyAll(d, cfg); err != nil {
		b.Fatal(err)
	}
	benchApplyAdminState(b, d, cfg)
}
