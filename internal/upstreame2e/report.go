// Package upstreame2e reads what Kubernetes' own e2e test binary (e2e.test,
// built from k8s.io/kubernetes/test/e2e) reports about a run against ebb:
// its Ginkgo JSON report (--ginkgo.json-report) becomes one row per case
// that was selected, with the reason the framework gave for a skip or a
// failure, and the counts docs/conformance.md and `make conformance`
// print.
package upstreame2e

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2/types"
)

// Outcome is what became of one case.
type Outcome string

const (
	Passed  Outcome = "pass"
	Failed  Outcome = "fail"
	Skipped Outcome = "skip"
)

// Case is one upstream test case (a Ginkgo It) that the run selected.
type Case struct {
	// Name is the case's full text, as --ginkgo.focus matches it: its
	// containers' texts and its own, labels included
	// ("[sig-network] LoadBalancers [Feature:LoadBalancer] should ...").
	Name    string
	Outcome Outcome
	// Duration is how long the case ran (setup and teardown included).
	Duration time.Duration
	// Reason is, for a skip or a failure, the first line of what the
	// framework said; empty for a pass.
	Reason string
	// Location is where a failure or skip was raised (file:line in
	// k8s.io/kubernetes), to name the upstream line an explanation is about.
	Location string
	// Requests and RequestErrors are what the rolling-update disruption
	// cases count through the load balancer while they roll a DaemonSet
	// (their "Load Balancer total HTTP requests", "Network errors" and
	// "HTTP errors" lines, summed over the updates); zero for other cases.
	Requests, RequestErrors int
}

// SuccessPct is the share of a disruption case's requests that succeeded,
// in percent; 0 when the case counted none.
func (c Case) SuccessPct() float64 {
	if c.Requests == 0 {
		return 0
	}
	return 100 * float64(c.Requests-c.RequestErrors) / float64(c.Requests)
}

// Summary counts a run's cases.
type Summary struct {
	Cases, Passed, Failed, Skipped int
	// NotSelected counts the suite's cases the focus left out.
	NotSelected int
	// DisruptionRequests and DisruptionErrors sum the rolling-update
	// disruption cases' requests (Case.Requests).
	DisruptionRequests, DisruptionErrors int
}

// Add is the sum of two runs' counts.
func (s Summary) Add(o Summary) Summary {
	return Summary{
		Cases: s.Cases + o.Cases, Passed: s.Passed + o.Passed, Failed: s.Failed + o.Failed, Skipped: s.Skipped + o.Skipped,
		NotSelected:        s.NotSelected + o.NotSelected,
		DisruptionRequests: s.DisruptionRequests + o.DisruptionRequests, DisruptionErrors: s.DisruptionErrors + o.DisruptionErrors,
	}
}

// DisruptionSuccessPct is the share of the disruption cases' requests
// that succeeded, in percent; 0 when none ran.
func (s Summary) DisruptionSuccessPct() float64 {
	return Case{Requests: s.DisruptionRequests, RequestErrors: s.DisruptionErrors}.SuccessPct()
}

// Parse reads a Ginkgo JSON report (a list of suite reports) and returns
// the selected cases in the order they ran, and the counts. selected says
// whether a case was chosen by the run's focus and skip patterns, given
// what Ginkgo matches them against (the suite's description and the
// case's full text, joined by a space): Ginkgo reports the cases it left
// out and the selected cases it never reached (a suite timeout, an
// interrupt) alike, as skipped with no message, and a selected case never
// run is a failure, not a skip.
// Suite-level nodes (BeforeSuite, ReportAfterSuite, ...) are not cases, but
// one that failed is returned as a failed case: a suite whose set-up
// failed must not read as a clean run.
func Parse(r io.Reader, selected func(name string) bool) ([]Case, Summary, error) {
	var reports []types.Report
	if err := json.NewDecoder(r).Decode(&reports); err != nil {
		return nil, Summary{}, fmt.Errorf("reading the Ginkgo JSON report: %w", err)
	}
	var cases []Case
	var sum Summary
	for _, report := range reports {
		specs := append(types.SpecReports(nil), report.SpecReports...)
		// In the order they started (Ginkgo gives every case one, those it
		// skipped too); any without one last.
		sort.SliceStable(specs, func(i, j int) bool {
			a, b := specs[i].StartTime, specs[j].StartTime
			if a.IsZero() || b.IsZero() {
				return !a.IsZero() && b.IsZero()
			}
			return a.Before(b)
		})
		for _, s := range specs {
			if !s.LeafNodeType.Is(types.NodeTypeIt) {
				if s.State.Is(types.SpecStateFailureStates) {
					cases = append(cases, caseOf(s, s.LeafNodeType.String()))
					sum.Cases++
					sum.Failed++
				}
				continue
			}
			c := caseOf(s, s.FullText())
			if neverStarted(s) {
				if !selected(report.SuiteDescription + " " + c.Name) {
					sum.NotSelected++
					continue
				}
				if s.State == types.SpecStatePending {
					c.Reason = "pending upstream"
				} else {
					c.Outcome, c.Reason = Failed, "not run: "+interruption(report)
				}
			}
			cases = append(cases, c)
			sum.Cases++
			sum.DisruptionRequests += c.Requests
			sum.DisruptionErrors += c.RequestErrors
			switch c.Outcome {
			case Passed:
				sum.Passed++
			case Skipped:
				sum.Skipped++
			default:
				sum.Failed++
			}
		}
	}
	return cases, sum, nil
}

// neverStarted says whether Ginkgo skipped a case without running it: it
// gives those no message (a case that skips itself says why).
func neverStarted(s types.SpecReport) bool {
	return (s.State == types.SpecStateSkipped || s.State == types.SpecStatePending) && s.Failure.Message == ""
}

// interruption says why a suite stopped before its end, as Ginkgo recorded
// it.
func interruption(r types.Report) string {
	if len(r.SpecialSuiteFailureReasons) > 0 {
		return "the suite stopped first (" + strings.Join(r.SpecialSuiteFailureReasons, "; ") + ")"
	}
	return "the suite stopped first"
}

func caseOf(s types.SpecReport, name string) Case {
	c := Case{Name: name, Duration: s.RunTime}
	c.Requests, c.RequestErrors = disruptionCounts(s.CapturedGinkgoWriterOutput)
	switch {
	case s.State == types.SpecStatePassed:
		c.Outcome = Passed
		return c
	case s.State == types.SpecStateSkipped || s.State == types.SpecStatePending:
		c.Outcome = Skipped
	default:
		c.Outcome = Failed
	}
	c.Reason = firstLine(s.Failure.Message)
	if c.Reason == "" {
		c.Reason = s.State.String()
	}
	if loc := s.Failure.Location; loc.FileName != "" {
		c.Location = fmt.Sprintf("%s:%d", trimToRepo(loc.FileName), loc.LineNumber)
	}
	return c
}

// trimToRepo shortens a source path to its place in k8s.io/kubernetes
// (test/e2e/network/loadbalancer.go), whatever module cache it was built in.
func trimToRepo(path string) string {
	for _, marker := range []string{"/test/e2e/", "/test/utils/"} {
		if i := strings.LastIndex(path, marker); i >= 0 {
			return path[i+1:]
		}
	}
	return path
}

// disruptionCounts sums what the rolling-update disruption cases log after
// each update (test/e2e/network/loadbalancer.go,
// testRollingUpdateLBConnectivityDisruption): the requests sent, and the
// network and HTTP errors among them.
func disruptionCounts(output string) (requests, errs int) {
	for _, line := range strings.Split(output, "\n") {
		for prefix, sum := range map[string]*int{
			"Load Balancer total HTTP requests: ": &requests,
			"Network errors: ":                    &errs,
			"HTTP errors: ":                       &errs,
		} {
			i := strings.Index(line, prefix)
			if i < 0 {
				continue
			}
			var n int
			if _, err := fmt.Sscanf(line[i+len(prefix):], "%d", &n); err == nil {
				*sum += n
			}
		}
	}
	return requests, errs
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

// WriteTable writes the cases as a Markdown table: case, result, seconds,
// and the reason for a skip or a failure.
func WriteTable(w io.Writer, cases []Case) error {
	var b strings.Builder
	b.WriteString("| case | result | seconds | reason |\n|---|---|---|---|\n")
	for _, c := range cases {
		reason := c.Reason
		if c.Location != "" {
			reason += " (" + c.Location + ")"
		}
		if c.Requests > 0 {
			counted := fmt.Sprintf("%.2f %% of %d requests through the load balancer succeeded", c.SuccessPct(), c.Requests)
			if reason == "" {
				reason = counted
			} else {
				reason += "; " + counted
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f | %s |\n", cell(c.Name), c.Outcome, c.Duration.Seconds(), cell(reason))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// cell keeps a table cell on one row.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}
