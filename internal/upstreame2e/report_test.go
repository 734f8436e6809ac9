package upstreame2e

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/onsi/ginkgo/v2/types"
)

func spec(text string, state types.SpecState, started bool, msg string) types.SpecReport {
	s := types.SpecReport{
		ContainerHierarchyTexts: []string{"[sig-network] LoadBalancers [Feature:LoadBalancer]"},
		LeafNodeType:            types.NodeTypeIt,
		LeafNodeText:            text,
		State:                   state,
		Failure:                 types.Failure{Message: msg},
	}
	if started {
		s.StartTime = time.Date(2026, 11, 28, 0, 0, len(text), 0, time.UTC)
		s.RunTime = 42 * time.Second
	}
	if msg != "" {
		s.Failure.Location = types.CodeLocation{FileName: "/root/go/pkg/mod/k8s.io/kubernetes@v1.36.3/test/e2e/network/loadbalancer.go", LineNumber: 451}
	}
	return s
}

// notFocused is the tests' selection: every case but those whose text
// says "not focused".
func notFocused(name string) bool {
	return strings.HasPrefix(name, "Kubernetes e2e suite [sig-network]") && !strings.Contains(name, "not focused")
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name  string
		specs []types.SpecReport
		want  []Case
		sum   Summary
		// interrupted is the suite's special failure reasons.
		interrupted []string
	}{
		{
			name: "pass, skip with its reason, failure with its first line, and cases the focus left out",
			specs: []types.SpecReport{
				spec("should fail", types.SpecStateFailed, true, "timed out waiting\nfor the load balancer"),
				spec("x", types.SpecStatePassed, true, ""),
				spec("should skip", types.SpecStateSkipped, true, "Test requires >= 2 Ready nodes"),
				spec("not focused", types.SpecStateSkipped, false, ""),
				spec("selected but not reached", types.SpecStateSkipped, false, ""),
			},
			want: []Case{
				{Name: "[sig-network] LoadBalancers [Feature:LoadBalancer] x", Outcome: Passed, Duration: 42 * time.Second},
				{Name: "[sig-network] LoadBalancers [Feature:LoadBalancer] should fail", Outcome: Failed, Duration: 42 * time.Second, Reason: "timed out waiting", Location: "test/e2e/network/loadbalancer.go:451"},
				{Name: "[sig-network] LoadBalancers [Feature:LoadBalancer] should skip", Outcome: Skipped, Duration: 42 * time.Second, Reason: "Test requires >= 2 Ready nodes", Location: "test/e2e/network/loadbalancer.go:451"},
				{Name: "[sig-network] LoadBalancers [Feature:LoadBalancer] selected but not reached", Outcome: Failed, Reason: "not run: the suite stopped first (Suite Timeout Elapsed)"},
			},
			sum:         Summary{Cases: 4, Passed: 1, Failed: 2, Skipped: 1, NotSelected: 1},
			interrupted: []string{"Suite Timeout Elapsed"},
		},
		{
			name: "a failed suite set-up is a failed case; a passed one is no case",
			specs: []types.SpecReport{
				{LeafNodeType: types.NodeTypeSynchronizedBeforeSuite, State: types.SpecStateFailed, Failure: types.Failure{Message: "no nodes Ready"}},
				{LeafNodeType: types.NodeTypeReportAfterSuite, State: types.SpecStatePassed},
			},
			want: []Case{{Name: "SynchronizedBeforeSuite", Outcome: Failed, Reason: "no nodes Ready"}},
			sum:  Summary{Cases: 1, Failed: 1},
		},
		{
			name:  "a case failed without a message says its state",
			specs: []types.SpecReport{spec("timed out", types.SpecStateTimedout, true, "")},
			want:  []Case{{Name: "[sig-network] LoadBalancers [Feature:LoadBalancer] timed out", Outcome: Failed, Duration: 42 * time.Second, Reason: "timedout"}},
			sum:   Summary{Cases: 1, Failed: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := json.Marshal([]types.Report{{SuiteDescription: "Kubernetes e2e suite", SpecReports: tc.specs, SpecialSuiteFailureReasons: tc.interrupted}})
			if err != nil {
				t.Fatal(err)
			}
			cases, sum, err := Parse(bytes.NewReader(data), notFocused)
			if err != nil {
				t.Fatal(err)
			}
			if len(cases) != len(tc.want) {
				t.Fatalf("cases %+v, want %+v", cases, tc.want)
			}
			for i := range cases {
				if cases[i] != tc.want[i] {
					t.Errorf("case %d: %+v, want %+v", i, cases[i], tc.want[i])
				}
			}
			if sum != tc.sum {
				t.Errorf("summary %+v, want %+v", sum, tc.sum)
			}
		})
	}
}

func TestParseRefusesWhatIsNoReport(t *testing.T) {
	if _, _, err := Parse(strings.NewReader(`{"not": "a list"}`), notFocused); err == nil {
		t.Fatal("a JSON object that is no list of suite reports was accepted")
	}
}

func TestWriteTable(t *testing.T) {
	var b strings.Builder
	err := WriteTable(&b, []Case{
		{Name: "a | b", Outcome: Passed, Duration: 1500 * time.Millisecond},
		{Name: "c", Outcome: Skipped, Reason: "LoadBalancer uses 'Proxy' IPMode", Location: "test/e2e/network/loadbalancer.go:1055"},
		{Name: "d", Outcome: Passed, Requests: 200, RequestErrors: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "| case | result | seconds | reason |\n|---|---|---|---|\n" +
		"| a \\| b | pass | 2 |  |\n" +
		"| c | skip | 0 | LoadBalancer uses 'Proxy' IPMode (test/e2e/network/loadbalancer.go:1055) |\n" +
		"| d | pass | 0 | 99.50 % of 200 requests through the load balancer succeeded |\n"
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestDisruptionCounts(t *testing.T) {
	s := spec("should not have connectivity disruption during rolling update with externalTrafficPolicy=Cluster", types.SpecStatePassed, true, "")
	s.CapturedGinkgoWriterOutput = "I1128 00:20:01.1 util.go:82] Load Balancer total HTTP requests: 6000\n" +
		"I1128 00:20:01.1 util.go:82] Network errors: 3\n" +
		"I1128 00:20:01.1 util.go:82] HTTP errors: 1\n" +
		"I1128 00:20:01.1 util.go:82] Success rate: 99.93%\n" +
		"I1128 00:21:01.1 util.go:82] Load Balancer total HTTP requests: 4000\n" +
		"I1128 00:21:01.1 util.go:82] Network errors: 0\n" +
		"I1128 00:21:01.1 util.go:82] HTTP errors: 0\n"
	data, err := json.Marshal([]types.Report{{SpecReports: []types.SpecReport{s, spec("other", types.SpecStatePassed, true, "")}}})
	if err != nil {
		t.Fatal(err)
	}
	cases, sum, err := Parse(bytes.NewReader(data), notFocused)
	if err != nil {
		t.Fatal(err)
	}
	if sum.DisruptionRequests != 10000 || sum.DisruptionErrors != 4 {
		t.Errorf("summary: %d requests, %d errors; want 10000, 4", sum.DisruptionRequests, sum.DisruptionErrors)
	}
	byName := map[string]Case{}
	for _, c := range cases {
		byName[c.Name] = c
	}
	c := byName[s.FullText()]
	if c.Requests != 10000 || c.RequestErrors != 4 || math.Abs(c.SuccessPct()-99.96) > 1e-9 {
		t.Errorf("rolling update case: %d requests, %d errors, %.2f %%; want 10000, 4, 99.96 %%", c.Requests, c.RequestErrors, c.SuccessPct())
	}
	if o := byName["[sig-network] LoadBalancers [Feature:LoadBalancer] other"]; o.Requests != 0 || o.SuccessPct() != 0 {
		t.Errorf("a case that counts no requests: %+v", o)
	}
}
