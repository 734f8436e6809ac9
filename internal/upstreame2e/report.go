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
}

// Summary counts a run's cases.
type Summary struct {
	Cases, Passed, Failed, Skipped int
	// NotSelected counts the suite's cases the focus left out.
	NotSelected int
}

// Parse reads a Ginkgo JSON report (a list of suite reports) and returns
// the selected cases in the order they ran, and the counts. Suite-level
// nodes (BeforeSuite, ReportAfterSuite, ...) are not cases, but one that
// failed is returned as a failed case: a suite whose set-up failed must
// not read as a clean run.
func Parse(r io.Reader) ([]Case, Summary, error) {
	var reports []types.Report
	if err := json.NewDecoder(r).Decode(&reports); err != nil {
		return nil, Summary{}, fmt.Errorf("reading the Ginkgo JSON report: %w", err)
	}
	var cases []Case
	var sum Summary
	for _, report := range reports {
		specs := append(types.SpecReports(nil), report.SpecReports...)
		sort.SliceStable(specs, func(i, j int) bool { return specs[i].StartTime.Before(specs[j].StartTime) })
		for _, s := range specs {
			if !s.LeafNodeType.Is(types.NodeTypeIt) {
				if s.State.Is(types.SpecStateFailureStates) {
					cases = append(cases, caseOf(s, s.LeafNodeType.String()))
					sum.Cases++
					sum.Failed++
				}
				continue
			}
			if notSelected(s) {
				sum.NotSelected++
				continue
			}
			c := caseOf(s, s.FullText())
			cases = append(cases, c)
			sum.Cases++
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

// notSelected says whether a case was left out by the focus or skip
// patterns rather than run: Ginkgo reports those as skipped without ever
// starting them, and with no message.
func notSelected(s types.SpecReport) bool {
	return (s.State == types.SpecStateSkipped || s.State == types.SpecStatePending) && s.Failure.Message == "" && s.StartTime.IsZero()
}

func caseOf(s types.SpecReport, name string) Case {
	c := Case{Name: name, Duration: s.RunTime}
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
		fmt.Fprintf(&b, "| %s | %s | %.0f | %s |\n", cell(c.Name), c.Outcome, c.Duration.Seconds(), cell(reason))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// cell keeps a table cell on one row.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}
