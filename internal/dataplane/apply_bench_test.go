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
	var cfg Config
	for f := range 50 {
		at := freeAddr(&testing.T{}, "tcp")
		fe := tcpFrontend(fmt.Sprintf("fe-%d", f), at)
		for i := range 10 {
			fe.Backends = append(fe.Backends, Backend{Address: fmt.Sprintf("10.0.0.%d", i+1), Port: uint16(30000 + f), Owner: fmt.Sprintf("node-%d", i+1)})
		}
		cfg.Frontends = append(cfg.Frontends, fe)
	}
	if err := applyAll(d, cfg); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		state := AdminDown
		if i%2 == 1 {
			state = AdminNone
		}
		for f := range cfg.Frontends {
			cfg.Frontends[f].Backends[3].AdminState = state
		}
		if err := applyAll(d, cfg); err != nil {
			b.Fatal(err)
		}
	}
}
