package upstream_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/upstreame2e"
)

func contextWithTimeout() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 4*time.Minute)
}

// focusCI is the set `make e2e` runs within CI's budget: the LoadBalancer
// cases that need no more than this cluster has and finish in minutes.
const focusCI = `\[Feature:LoadBalancer\]`

// focusFull is every case that applies to a LoadBalancer implementation,
// and the Conformance cases of the Services tests as a check that
// installing ebb breaks nothing (make conformance).
const focusFull = `\[Feature:LoadBalancer\]|\[sig-network\] Services .*\[Conformance\]|LoadBalancer`

// skipAlways are cases that do not apply to any LoadBalancer
// implementation on this cluster, with the reason (docs/conformance.md
// repeats it).
const skipAlways = `\[Disruptive\]|\[Serial\]|\[Flaky\]|\[Feature:(IPv6DualStack|Networking-IPv6|SCTPConnectivity|ServiceCIDRs)\]|Windows`

// upstreamRun is what a run needs: the binary, the cases, where it writes.
type upstreamRun struct {
	binary, focus, skip, dir string
	// timeout bounds the whole run (Ginkgo's own --ginkgo.timeout).
	timeout time.Duration
}

// TestUpstreamLoadBalancerCases runs the upstream e2e binary's selected
// cases against ebb and fails on any failure: each case's result, time
// and reason are logged as a table (and, with EBB_UPSTREAM_SUMMARY, the
// JSON summary written there).
func TestUpstreamLoadBalancerCases(t *testing.T) {
	binary := os.Getenv("EBB_UPSTREAM_E2E")
	if binary == "" {
		t.Fatal("EBB_UPSTREAM_E2E names no e2e.test: run the suite through make (make e2e, make conformance), which builds it with hack/upstream-e2e.sh")
	}
	run := upstreamRun{binary: binary, focus: focusCI, skip: skipAlways, dir: filepath.Join(cluster.Dir(), "upstream"), timeout: 25 * time.Minute}
	if os.Getenv("EBB_UPSTREAM_FOCUS") == "full" {
		run.focus, run.timeout = focusFull, 90*time.Minute
	}
	start := time.Now()
	cases, sum, err := runUpstream(t, run)
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := upstreamE2ETable(&table, cases); err != nil {
		t.Fatal(err)
	}
	t.Logf("upstream e2e (k8s.io/kubernetes v1.36.3), focus %q, skip %q, %s:\n%s", run.focus, run.skip, time.Since(start).Round(time.Second), table.String())
	summary := map[string]any{
		"date":             time.Now().UTC().Format(time.RFC3339),
		"focus":            run.focus,
		"upstream_cases":   sum.Cases,
		"upstream_passed":  sum.Passed,
		"upstream_failed":  sum.Failed,
		"upstream_skipped": sum.Skipped,
		"wall_seconds":     int(time.Since(start).Seconds()),
	}
	line, _ := json.Marshal(summary)
	t.Logf("summary: %s", line)
	if out := os.Getenv("EBB_UPSTREAM_SUMMARY"); out != "" {
		if err := os.WriteFile(out, append(line, '\n'), 0o644); err != nil {
			t.Error(err)
		}
		if err := os.WriteFile(strings.TrimSuffix(out, ".json")+".md", table.Bytes(), 0o644); err != nil {
			t.Error(err)
		}
	}
	if sum.Cases == 0 {
		t.Fatalf("the focus %q selected no case: the upstream suite changed, or the binary is not k8s.io/kubernetes' e2e.test", run.focus)
	}
	for _, c := range cases {
		if c.Outcome == upstreame2e.Failed {
			t.Errorf("upstream case failed: %s: %s (%s)", c.Name, c.Reason, c.Location)
		}
	}
}

func upstreamE2ETable(w *bytes.Buffer, cases []upstreame2e.Case) error {
	return upstreame2e.WriteTable(w, cases)
}

// runUpstream runs e2e.test on the client host behind the router and reads
// its report. The binary's output goes to dir/e2e.log; its last lines are
// logged when it fails to report at all.
func runUpstream(t *testing.T, run upstreamRun) ([]upstreame2e.Case, upstreame2e.Summary, error) {
	t.Helper()
	if err := os.MkdirAll(run.dir, 0o755); err != nil {
		return nil, upstreame2e.Summary{}, err
	}
	report := filepath.Join(run.dir, "report.json")
	logPath := filepath.Join(run.dir, "e2e.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, upstreame2e.Summary{}, err
	}
	defer logFile.Close()
	ctx, cancel := context.WithTimeout(context.Background(), run.timeout+5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, run.binary,
		"--kubeconfig="+cluster.Kubeconfig,
		// No cloud: the cluster's load balancer is ebb, which the
		// provider-independent cases reach through the Service's status.
		"--provider=local",
		"--ginkgo.focus="+run.focus,
		"--ginkgo.skip="+run.skip,
		"--ginkgo.json-report="+report,
		"--ginkgo.timeout="+run.timeout.String(),
		"--ginkgo.no-color",
		"--report-dir="+run.dir,
		// The cluster runs no kube-system pods and no DNS: the cases
		// selected need neither.
		"--minStartupPods=0",
		"--num-nodes="+fmt.Sprint(len(cluster.Nodes)),
		"--e2e-verify-service-account=false",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cluster.Kubeconfig)
	t.Logf("running %s (output in %s)", strings.Join(cmd.Args, " "), logPath)
	if err := cluster.ExternalClient.Start(cmd); err != nil {
		return nil, upstreame2e.Summary{}, fmt.Errorf("starting %s on the client host: %w", run.binary, err)
	}
	runErr := cmd.Wait()
	f, err := os.Open(report)
	if err != nil {
		return nil, upstreame2e.Summary{}, fmt.Errorf("e2e.test wrote no report (%v); the end of its output:\n%s", runErr, tail(logPath, 40))
	}
	defer f.Close()
	cases, sum, err := upstreame2e.Parse(f)
	if err != nil {
		return nil, upstreame2e.Summary{}, err
	}
	if runErr != nil && sum.Failed == 0 {
		return nil, upstreame2e.Summary{}, fmt.Errorf("e2e.test failed (%v) with no failed case; the end of its output:\n%s", runErr, tail(logPath, 40))
	}
	return cases, sum, nil
}

// tail is the last n lines of a file.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
