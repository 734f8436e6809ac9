package lb

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// When the kernel path fails (a table name nftables refuses stands for an
// older kernel or a program the verifier refuses), ebb lb is not ready
// while a frontend that names the kernel engine goes unserved, so that a
// rolling update stops at the first host; with engine Auto it serves the
// frontend with the proxy and is ready. (Before, /readyz said ready while
// every kernel frontend was refused.)
func TestReadinessFollowsTheKernelEngine(t *testing.T) {
	for _, tc := range []struct {
		engine string
		ready  bool
	}{{"Kernel", false}, {"Auto", true}} {
		t.Run(tc.engine, func(t *testing.T) {
			a, _ := namedBackend(t, "a")
			fe, metrics := freePort(t), freePort(t)
			file := filepath.Join(t.TempDir(), "lb.yaml")
			replaceFile(t, file, config(fe, a))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			o := &Options{ConfigFile: file, MetricsAddress: metrics, PollInterval: 20 * time.Millisecond,
				Engine: tc.engine, KernelTable: strings.Repeat("x", 300), KernelPath: "nftables"}
			done := make(chan error, 1)
			go func() { done <- o.Run(ctx) }()
			eventually(t, "/metrics to answer", func() bool { return scrapeOrEmpty(metrics) != "" })
			time.Sleep(200 * time.Millisecond) // a few polls: readiness must not flip
			if got := readyz(metrics); got != tc.ready {
				t.Errorf("/readyz ready = %v with engine %s and the kernel path failing, want %v", got, tc.engine, tc.ready)
			}
			if got, err := ask(fe); tc.ready && got != "a" {
				t.Errorf("engine %s: answer %q (%v), want the proxy to serve a", tc.engine, got, err)
			}
			if !tc.ready {
				// The frontend moved to the proxy: ready again.
				replaceFile(t, file, strings.Replace(config(fe, a), "  backends:", "  engine: Proxy\n  backends:", 1))
				eventually(t, "ready once no frontend names the kernel", func() bool { return readyz(metrics) })
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}
