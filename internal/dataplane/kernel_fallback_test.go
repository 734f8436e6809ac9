package dataplane

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// brokenKernelPlane is a data plane whose kernel path cannot install its
// tables (a table name nftables refuses stands for an older kernel or a
// refused program), in n's load-balancer host.
func brokenKernelPlane(t *testing.T, n *engineNet, engine Engine) *DataPlane {
	t.Helper()
	opts := n.options()
	opts.Engine = engine
	opts.KernelTable = strings.Repeat("x", 300)
	return newDataPlane(t, opts)
}

// applyIn applies cfg to d inside n's load-balancer host, where the
// proxy's sockets must open.
func applyIn(t *testing.T, n *engineNet, d *DataPlane, cfg Config) ApplyResult {
	t.Helper()
	var res ApplyResult
	err := n.lb.Do(func() (err error) {
		res, err = d.Apply(cfg)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// When the kernel path fails under frontends that engine Auto gave it,
// Auto gives them to the proxy, at once and from then on: they are served.
// (Before, they were refused on every LB host while readiness said ready.)
func TestAutoFallsBackToTheProxyWhenTheKernelPathFails(t *testing.T) {
	n := newEngineNet(t, EngineProxy, "IPv4")
	d := brokenKernelPlane(t, n, EngineAuto)
	a, _ := n.echo(t, 8080)
	if res := applyIn(t, n, d, Config{Frontends: []Frontend{n.frontendOn(80, a)}}); len(res.Skipped) != 0 {
		t.Fatalf("skipped %v, want the frontend served by the proxy", res.Skipped)
	}
	if err := n.roundTripNew(t, 80); err != nil {
		t.Fatalf("a new connection to the Auto frontend: %v", err)
	}
	if d.KernelFailing() {
		t.Error("KernelFailing() = true with every frontend served")
	}
	if got := testutil.ToFloat64(d.m.autoFallback); got != 1 {
		t.Errorf("ebb_dataplane_kernel_auto_fallback = %v, want 1", got)
	}
	// A later apply stays with the proxy rather than trying again.
	if res := applyIn(t, n, d, Config{Frontends: []Frontend{n.frontendOn(80, a), n.frontendOn(81, a)}}); len(res.Skipped) != 0 {
		t.Fatalf("skipped %v on a later apply", res.Skipped)
	}
	if err := n.roundTripNew(t, 81); err != nil {
		t.Fatalf("a new connection to a later Auto frontend: %v", err)
	}
}

// A frontend that names the kernel engine is not served when the kernel
// path fails, and KernelFailing says so (ebb lb's readiness), until no
// frontend wants the kernel any more.
func TestKernelFailingWhileAKernelFrontendCannotBeServed(t *testing.T) {
	n := newEngineNet(t, EngineProxy, "IPv4")
	d := brokenKernelPlane(t, n, EngineKernel)
	a, _ := n.echo(t, 8080)
	res := applyIn(t, n, d, Config{Frontends: []Frontend{n.frontendOn(80, a)}})
	if len(res.Skipped) != 1 || res.Skipped[0].Reason != SkipKernelFailed {
		t.Fatalf("skipped %v, want the frontend skipped with KernelFailed", res.Skipped)
	}
	if !d.KernelFailing() {
		t.Error("KernelFailing() = false with a kernel frontend refused")
	}
	applyIn(t, n, d, Config{})
	if d.KernelFailing() {
		t.Error("KernelFailing() = true with no frontend wanting the kernel")
	}
}
