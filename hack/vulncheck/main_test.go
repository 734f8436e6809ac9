package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// stream is govulncheck's JSON output, cut down: a config, two advisories,
// one called (with a fix), one called without a fix, and one only imported.
const stream = `{"config":{"protocol_version":"v1.0.0","go_version":"go1.27.3"}}
{"progress":{"message":"Scanning your code..."}}
{"osv":{"id":"GO-2026-6443","summary":"Server panic in grpc"}}
{"osv":{"id":"GO-2026-4736","summary":"GoBGP NEXT_HOP DoS"}}
{"osv":{"id":"GO-2026-1111","summary":"only imported"}}
{"finding":{"osv":"GO-2026-1111","trace":[{"module":"example.com/m","version":"v1.0.0","package":"example.com/m/p"}]}}
{"finding":{"osv":"GO-2026-6443","fixed_version":"v1.82.2","trace":[{"module":"google.golang.org/grpc","version":"v1.82.1","package":"google.golang.org/grpc/internal/transport","function":"HandleStreams","receiver":"*http2Server"},{"module":"github.com/ebbdev/ebb","function":"Start"}]}}
{"finding":{"osv":"GO-2026-6443","fixed_version":"v1.82.2","trace":[{"module":"google.golang.org/grpc","version":"v1.82.1","package":"google.golang.org/grpc/internal/transport","function":"Other"}]}}
{"finding":{"osv":"GO-2026-5932","trace":[{"module":"golang.org/x/crypto/openpgp","version":"v0.1.0","package":"golang.org/x/crypto/openpgp","function":"Read"}]}}
{"finding":{"osv":"GO-2026-5932","fixed_version":"v0.59.0","trace":[{"module":"golang.org/x/crypto","version":"v0.58.0","package":"golang.org/x/crypto/openpgp/armor","function":"Decode"}]}}
{"finding":{
  "osv":"GO-2026-4736",
  "trace":[{"module":"github.com/osrg/gobgp/v4","version":"v4.8.0","package":"github.com/osrg/gobgp/v4/pkg/server","function":"recvMessageloop","receiver":"*fsmHandler"}]}}
`

func TestDecode(t *testing.T) {
	rep, err := decode(strings.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	if rep.goVersion != "go1.27.3" {
		t.Errorf("go version %q", rep.goVersion)
	}
	// A binary's scan names its Go release in the SBOM message only.
	bin, err := decode(strings.NewReader(`{"config":{"scan_mode":"binary"}}` + "\n" + `{"SBOM":{"go_version":"go1.26.8","roots":["github.com/ebbdev/ebb"]}}`))
	if err != nil || bin.goVersion != "go1.26.8" {
		t.Errorf("binary scan: go version %q, %v", bin.goVersion, err)
	}
	want := map[string]*finding{
		"GO-2026-6443": {ID: "GO-2026-6443", Module: "google.golang.org/grpc", Version: "v1.82.1", Fixed: "v1.82.2", Symbol: "google.golang.org/grpc/internal/transport.http2Server.HandleStreams"},
		"GO-2026-4736": {ID: "GO-2026-4736", Module: "github.com/osrg/gobgp/v4", Version: "v4.8.0", Symbol: "github.com/osrg/gobgp/v4/pkg/server.fsmHandler.recvMessageloop"},
		// The unfixed module came first; the fixed one decides.
		"GO-2026-5932": {ID: "GO-2026-5932", Module: "golang.org/x/crypto", Version: "v0.58.0", Fixed: "v0.59.0", Symbol: "golang.org/x/crypto/openpgp/armor.Decode"},
	}
	if !reflect.DeepEqual(rep.reached, want) {
		t.Errorf("reached:\n got %+v\nwant %+v", rep.reached, want)
	}
	if _, err := decode(strings.NewReader(`{"config":`)); err == nil {
		t.Error("a cut-off stream decoded without an error")
	}
}

func TestJudge(t *testing.T) {
	grpc := &finding{ID: "GO-2026-6443", Module: "google.golang.org/grpc", Version: "v1.82.1", Fixed: "v1.82.2", Symbol: "s"}
	gobgp := &finding{ID: "GO-2026-4736", Module: "github.com/osrg/gobgp/v4", Version: "v4.8.0", Symbol: "s"}
	tests := []struct {
		name         string
		goVersion    string
		reached      []*finding
		accepted     map[string]string
		wantProblems []string // substrings, in order
		wantNotes    int
	}{
		{name: "nothing reached", goVersion: "go1.27.3"},
		{name: "a fix exists", goVersion: "go1.27.3", reached: []*finding{grpc}, wantProblems: []string{"GO-2026-6443 (sum) in google.golang.org/grpc@v1.82.1, reached through s: fixed in v1.82.2"}},
		{name: "a fix exists even if accepted", goVersion: "go1.27.3", reached: []*finding{grpc}, accepted: map[string]string{"GO-2026-6443": "x"}, wantProblems: []string{"fixed in v1.82.2"}},
		{name: "no fix, accepted", goVersion: "go1.27.3", reached: []*finding{gobgp}, accepted: map[string]string{"GO-2026-4736": "peers only"}, wantNotes: 1},
		{name: "no fix, not accepted", goVersion: "go1.27.3", reached: []*finding{gobgp}, wantProblems: []string{"not in the accepted list"}},
		{name: "wrong toolchain", goVersion: "go1.26.8", wantProblems: []string{"scanned with go1.26.8, but go.mod pins toolchain go1.27.3"}},
		{name: "both, sorted", goVersion: "go1.27.3", reached: []*finding{grpc, gobgp}, wantProblems: []string{"GO-2026-4736", "GO-2026-6443"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := report{goVersion: tt.goVersion, summaries: map[string]string{}, reached: map[string]*finding{}}
			for _, f := range tt.reached {
				rep.reached[f.ID] = f
				rep.summaries[f.ID] = "sum"
			}
			problems, notes := judge(rep, "go1.27.3", tt.accepted)
			if len(problems) != len(tt.wantProblems) {
				t.Fatalf("problems %q, want %d", problems, len(tt.wantProblems))
			}
			for i, want := range tt.wantProblems {
				if !strings.Contains(problems[i], want) {
					t.Errorf("problem %d %q does not say %q", i, problems[i], want)
				}
			}
			if len(notes) != tt.wantNotes {
				t.Errorf("notes %q, want %d", notes, tt.wantNotes)
			}
		})
	}
}

func TestPinnedToolchainAndAccepted(t *testing.T) {
	dir := t.TempDir()
	gomod := filepath.Join(dir, "go.mod")
	for _, tt := range []struct{ content, want string }{
		{"module m\n\ngo 1.26.0\n\ntoolchain go1.27.3\n", "go1.27.3"},
		{"module m\n\ngo 1.26.0\n\ntoolchain go1.27.3 // the image's\n", "go1.27.3"},
		{"module m\n\ngo 1.26.0\n", ""},
	} {
		if err := os.WriteFile(gomod, []byte(tt.content), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := pinnedToolchain(gomod)
		if got != tt.want || (tt.want == "") != (err != nil) {
			t.Errorf("pinnedToolchain(%q) = %q, %v", tt.content, got, err)
		}
	}
	// The committed list parses, and every line has a reason.
	if _, err := readAccepted("accepted.txt"); err != nil {
		t.Error(err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("GO-2026-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readAccepted(bad); err == nil {
		t.Error("an advisory without a reason was accepted")
	}
}
