package upstream_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/lbmodel"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/upstreame2e"
)

// focusCI is the set `make e2e` runs within CI's budget: the LoadBalancer
// cases that need no more than this cluster has and finish in minutes.
const focusCI = `\[Feature:LoadBalancer\]`

// skipCI leaves out of CI's run, for time (make conformance runs them):
// the two rolling-update disruption cases (each rolls a DaemonSet five
// times across the nodes with a 60 s termination grace: a quarter of an
// hour per case), the source-ranges case (7.5 minutes, mostly waiting for
// addresses to become unreachable), and the one known failure
// (knownFailures).
const skipCI = `connectivity disruption during rolling update|loadbalancer source ranges|should only target nodes with endpoints`

// knownFailures are the cases that fail on this cluster for a reason that
// is not ebb's, by the case's name, with the explanation
// docs/conformance.md repeats: the case is still run and reported as
// failed, but does not fail the test.
var knownFailures = map[string]string{
	"[sig-network] LoadBalancers ExternalTrafficPolicy: Local [Feature:LoadBalancer] [Slow] should only target nodes with endpoints": "the case health-checks the Service's healthCheckNodePort on every InternalIP of every node (test/e2e/network/loadbalancer.go:1148); the local cluster's nodes are dual-stack, the case's Service is IPv4, and kube-proxy serves a Service's health check only in the Service's own family, so the node's IPv6 address never answers. kube-proxy's behaviour, not ebb's; the checks that ran before it, through the load balancer and on the node's IPv4 address, passed.",
}

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

// pass is one run of the upstream cases against one way of choosing ebb.
type pass struct {
	name string
	// setUp makes the cluster's LoadBalancer Services ebb's for the pass.
	setUp func(t *testing.T)
}

// TestUpstreamLoadBalancerCases runs the upstream e2e binary's selected
// cases against ebb, in two passes: ebb as the cluster's default load
// balancer (class-less Services), and with every Service the cases create
// given ebb's class (classPolicy). It fails on any failed case; each
// case's result, time and reason are logged as a table per pass (and, with
// EBB_UPSTREAM_SUMMARY, the tables and the JSON summary written there).
func TestUpstreamLoadBalancerCases(t *testing.T) {
	dir := os.Getenv("EBB_UPSTREAM_E2E")
	if dir == "" {
		t.Fatal("EBB_UPSTREAM_E2E names no directory with e2e.test: run the suite through make (make e2e, make conformance), which builds it with hack/upstream-e2e.sh")
	}
	binary := filepath.Join(dir, "e2e.test")
	run := upstreamRun{binary: binary, focus: focusCI, skip: skipAlways + "|" + skipCI, timeout: 40 * time.Minute}
	// EBB_UPSTREAM_FOCUS: "full" (make conformance), or a focus of one's
	// own (a regular expression over the cases' names) to run a few.
	switch focus := os.Getenv("EBB_UPSTREAM_FOCUS"); focus {
	case "":
	case "full":
		run.focus, run.skip, run.timeout = focusFull, skipAlways, 120*time.Minute
	default:
		run.focus, run.skip, run.timeout = focus, skipAlways, 120*time.Minute
	}
	passes := []pass{
		{name: "default-load-balancer", setUp: func(*testing.T) {}},
		{name: "class-" + strings.ReplaceAll(lbmodel.ClassL4, "/", "-"), setUp: withClassPolicy},
	}
	start := time.Now()
	total := upstreame2e.Summary{}
	explained := 0
	var tables bytes.Buffer
	for i, p := range passes {
		t.Run(p.name, func(t *testing.T) {
			p.setUp(t)
			r := run
			r.dir = filepath.Join(cluster.Dir(), "upstream-"+p.name)
			r.timeout = passTimeout(t, run.timeout, len(passes)-i)
			passStart := time.Now()
			cases, sum, err := runUpstream(t, r)
			if err != nil {
				t.Fatal(err)
			}
			var table bytes.Buffer
			if err := upstreame2e.WriteTable(&table, cases); err != nil {
				t.Fatal(err)
			}
			t.Logf("upstream e2e (k8s.io/kubernetes v1.36.3), pass %s, focus %q, skip %q, %s: %d cases, %d passed, %d failed, %d skipped\n%s",
				p.name, r.focus, r.skip, time.Since(passStart).Round(time.Second), sum.Cases, sum.Passed, sum.Failed, sum.Skipped, table.String())
			fmt.Fprintf(&tables, "### Pass: %s (%s)\n\n%s\n", p.name, time.Since(passStart).Round(time.Second), table.String())
			total = total.Add(sum)
			if sum.Cases == 0 {
				t.Fatalf("the focus %q selected no case: the upstream suite changed, or the binary is not k8s.io/kubernetes' e2e.test", r.focus)
			}
			for _, c := range cases {
				if c.Outcome != upstreame2e.Failed {
					continue
				}
				if why, ok := knownFailures[c.Name]; ok {
					explained++
					t.Logf("upstream case failed, as known: %s: %s (%s); why: %s", c.Name, c.Reason, c.Location, why)
					continue
				}
				t.Errorf("upstream case failed: %s: %s (%s)", c.Name, c.Reason, c.Location)
			}
		})
	}
	writeSummary(t, len(passes), total, explained, time.Since(start), tables.Bytes())
}

// writeSummary logs the JSON summary of the passes and, with
// EBB_UPSTREAM_SUMMARY, writes it there and the passes' tables beside it
// (.md): make conformance prints both.
func writeSummary(t *testing.T, passes int, total upstreame2e.Summary, explained int, took time.Duration, tables []byte) {
	t.Helper()
	summary := map[string]any{
		"date":             time.Now().UTC().Format(time.RFC3339),
		"kubernetes":       "v1.36.3",
		"passes":           passes,
		"upstream_cases":   total.Cases,
		"upstream_passed":  total.Passed,
		"upstream_failed":  total.Failed,
		"upstream_skipped": total.Skipped,
		// Of the failed, those knownFailures explains.
		"upstream_failed_explained": explained,
		"wall_seconds":              int(took.Seconds()),
	}
	// The rolling-update disruption cases (upstream accepts 95 %); null
	// when none ran to its counts.
	summary["rolling_update_success_pct"] = nil
	summary["rolling_update_requests"] = total.DisruptionRequests
	if total.DisruptionRequests > 0 {
		summary["rolling_update_success_pct"] = total.DisruptionSuccessPct()
	}
	line, _ := json.Marshal(summary)
	t.Logf("summary: %s", line)
	if out := os.Getenv("EBB_UPSTREAM_SUMMARY"); out != "" {
		if err := os.WriteFile(out, append(line, '\n'), 0o644); err != nil {
			t.Error(err)
		}
		if err := os.WriteFile(strings.TrimSuffix(out, ".json")+".md", tables, 0o644); err != nil {
			t.Error(err)
		}
	}
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
		// kube-system runs CoreDNS only, which the cluster waited for.
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
		return nil, upstreame2e.Summary{}, fmt.Errorf("e2e.test wrote no report (%v); the end of its output:\n%s", runErr, localcluster.LogTail(logPath, 40))
	}
	defer f.Close()
	// Ginkgo matches the patterns against the suite's description and the
	// case's full text, joined by a space; so does the parser.
	focus, skip := regexp.MustCompile(run.focus), regexp.MustCompile(run.skip)
	selected := func(name string) bool { return focus.MatchString(name) && !skip.MatchString(name) }
	cases, sum, err := upstreame2e.Parse(f, selected)
	if err != nil {
		return nil, upstreame2e.Summary{}, err
	}
	if runErr != nil && sum.Failed == 0 {
		return nil, upstreame2e.Summary{}, fmt.Errorf("e2e.test failed (%v) with no failed case; the end of its output:\n%s", runErr, localcluster.LogTail(logPath, 40))
	}
	return cases, sum, nil
}

// passTimeout is the Ginkgo timeout of a pass: at most want, and no more
// than its share of what go test's -timeout leaves (minus a margin for
// writing the reports), so that Ginkgo's own timeout, which still writes
// the report, comes before go test's, which writes nothing.
func passTimeout(t *testing.T, want time.Duration, passesLeft int) time.Duration {
	deadline, ok := t.Deadline()
	if !ok {
		return want
	}
	share := (time.Until(deadline) - 2*time.Minute) / time.Duration(passesLeft)
	if share < want {
		// The binary's own start and the kill margin in runUpstream.
		share -= 30 * time.Second
		if share < time.Minute {
			t.Fatalf("go test's -timeout leaves %s for %d passes: raise it", time.Until(deadline).Round(time.Second), passesLeft)
		}
		return share
	}
	return want
}
