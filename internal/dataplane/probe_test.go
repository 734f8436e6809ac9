package dataplane

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"
)

// A backend failing its HTTP probe is taken out only after the unhealthy
// threshold, and readmitted only after the healthy threshold; admin Up
// ignores the probe.
func TestProbeThresholdsAndAdminUp(t *testing.T) {
	var failing atomic.Bool
	var probes atomic.Int64
	health := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			w.WriteHeader(http.StatusNotFound)
		} else if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		probes.Add(1)
	}))
	defer health.Close()
	healthPort := health.Listener.Addr().(*net.TCPAddr).AddrPort().Port()

	a, b := newTestBackend(t), newTestBackend(t)
	clk := testingclock.NewFakeClock(time.Now())
	d := newDataPlane(t, Options{Clock: clk})
	at := freeAddr(t, "tcp")
	fe := tcpFrontend("web", at, a.backend(), b.backend())
	// Backend a is probed on the switchable health server, b on one that
	// is always healthy.
	alwaysHealthy := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer alwaysHealthy.Close()
	fe.Backends[0].ProbePort = healthPort
	fe.Backends[1].ProbePort = alwaysHealthy.Listener.Addr().(*net.TCPAddr).AddrPort().Port()
	fe.HealthCheck = &HealthCheck{Protocol: ProbeHTTP, Path: "/healthz", Interval: Duration{time.Second}, UnhealthyThreshold: 2, HealthyThreshold: 2}
	mustApply(t, d, fe)

	healthyA := func() bool { return d.Status()[backendIndex(d, a)].Healthy }
	// probe advances the fake clock one interval and waits for the probe of
	// a to be answered and its result recorded.
	probe := func() {
		t.Helper()
		before := probeRounds(d)
		clk.Step(time.Second)
		waitFor(t, "a probe's result", func() bool { return probeRounds(d) > before })
	}
	// Wait for every prober's first result to be recorded, not only for
	// the health server to have answered: a result recorded after probe()
	// read its count would pass for the next probe's.
	waitFor(t, "the first probe's result", func() bool { return probes.Load() >= 1 && probeRounds(d) >= 1 })
	if !healthyA() {
		t.Fatal("a healthy backend is not healthy")
	}
	failing.Store(true)
	probe()
	if !healthyA() {
		t.Fatal("one failed probe took the backend out; the threshold is 2")
	}
	probe()
	if healthyA() {
		t.Fatal("two failed probes did not take the backend out")
	}
	before := a.accepted.Load()
	for range 10 {
		if err := dialRoundTrip(at.String()); err != nil {
			t.Fatal(err)
		}
	}
	if a.accepted.Load() != before {
		t.Error("an unhealthy backend got new connections")
	}

	// Admin Up ignores the probe.
	fe.Backends[0].AdminState = AdminUp
	mustApply(t, d, fe)
	for range 10 {
		if err := dialRoundTrip(at.String()); err != nil {
			t.Fatal(err)
		}
	}
	if a.accepted.Load() == before {
		t.Error("admin Up did not override the failing probe")
	}
	fe.Backends[0].AdminState = AdminNone
	mustApply(t, d, fe)

	failing.Store(false)
	probe()
	if healthyA() {
		t.Fatal("one good probe readmitted the backend; the threshold is 2")
	}
	probe()
	if !healthyA() {
		t.Fatal("two good probes did not readmit the backend")
	}
}

func backendIndex(d *DataPlane, b *testBackend) int {
	for i, s := range d.Status() {
		if s.Address == b.ln.Addr().(*net.TCPAddr).AddrPort() {
			return i
		}
	}
	return -1
}

// Backends that share a probe target share one prober, and a prober that no
// configuration needs any more stops.
func TestProbersAreSharedAndStopped(t *testing.T) {
	a, b := newTestBackend(t), newTestBackend(t)
	d := newDataPlane(t, Options{})
	hc := &HealthCheck{Protocol: ProbeTCP, Port: a.backend().Port, Interval: Duration{time.Hour}}
	f1 := tcpFrontend("one", freeAddr(t, "tcp"), a.backend(), b.backend())
	f2 := tcpFrontend("two", freeAddr(t, "tcp"), a.backend())
	f1.HealthCheck, f2.HealthCheck = hc, hc
	mustApply(t, d, f1, f2)
	if n := len(d.probers); n != 1 {
		t.Errorf("%d probers for one shared target, want 1", n)
	}
	mustApply(t, d, tcpFrontend("one", freeAddr(t, "tcp"), a.backend()))
	if n := len(d.probers); n != 0 {
		t.Errorf("%d probers left without health checks, want 0", n)
	}
}

// A backend starts healthy (as HAProxy starts servers up) but is confirmed
// only once a probe succeeded: what a mode switch waits for.
func TestConfirmedOnlyAfterAProbeSucceeds(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	var probes atomic.Int64
	health := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		probes.Add(1)
	}))
	defer health.Close()
	a := newTestBackend(t)
	clk := testingclock.NewFakeClock(time.Now())
	d := newDataPlane(t, Options{Clock: clk})
	fe := tcpFrontend("web", freeAddr(t, "tcp"), a.backend())
	fe.Backends[0].ProbePort = health.Listener.Addr().(*net.TCPAddr).AddrPort().Port()
	fe.HealthCheck = &HealthCheck{Protocol: ProbeHTTP, Path: "/healthz", Interval: Duration{time.Second}, UnhealthyThreshold: 2, HealthyThreshold: 2}
	mustApply(t, d, fe)
	waitFor(t, "the first probe's result", func() bool { return probeRounds(d) >= 1 })
	if st := d.Status()[0]; !st.Healthy || st.Confirmed {
		t.Fatalf("after one failed probe: healthy %v confirmed %v, want healthy (threshold 2), not confirmed", st.Healthy, st.Confirmed)
	}
	failing.Store(false)
	clk.Step(time.Second)
	waitFor(t, "a confirmed backend", func() bool { return d.Status()[0].Confirmed })
}
