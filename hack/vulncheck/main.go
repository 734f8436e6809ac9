// Command vulncheck holds ebb to the Go vulnerability database: it runs
// govulncheck (golang.org/x/vuln/scan) over ebb's source and, with
// -binary, over the image's binary, against a database built from a pinned
// golang.org/x/vulndb (hack/vulncheck.sh builds it; nothing is fetched from
// vuln.go.dev, so the same commit gives the same answer).
//
// It fails when ebb's code reaches an advisory that has a fixed release
// (upgrade the module, or the toolchain for the standard library), when it
// reaches one without a fix that accepted.txt does not list with a reason,
// and when the Go release scanned is not the one go.mod's toolchain line
// pins (the standard library's advisories depend on it).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/vuln/scan"
)

func main() {
	db := flag.String("db", "", "directory of the v1 vulnerability database (hack/vulncheck.sh builds it)")
	dir := flag.String("C", ".", "the module to scan")
	binary := flag.String("binary", "", "also scan this Go binary (the image's)")
	accepted := flag.String("accepted", "", "file of advisories reached without a fix that are accepted: ID, then the reason")
	flag.Parse()
	if err := run(context.Background(), *db, *dir, *binary, *accepted, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "vulncheck:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, db, dir, binary, acceptedPath string, out io.Writer) error {
	if db == "" {
		return errors.New("-db is required")
	}
	absDB, err := filepath.Abs(db)
	if err != nil {
		return err
	}
	toolchain, err := pinnedToolchain(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	accepted := map[string]string{}
	if acceptedPath != "" {
		if accepted, err = readAccepted(acceptedPath); err != nil {
			return err
		}
	}
	scans := []struct{ name, mode, target string }{{"source", "source", "./..."}}
	if binary != "" {
		abs, err := filepath.Abs(binary)
		if err != nil {
			return err
		}
		scans = append(scans, struct{ name, mode, target string }{"binary " + binary, "binary", abs})
	}
	failed := false
	stale := map[string]bool{}
	for id := range accepted {
		stale[id] = true
	}
	for _, s := range scans {
		rep, err := govulncheck(ctx, "file://"+absDB, dir, s.mode, s.target)
		if err != nil {
			return fmt.Errorf("scanning %s: %w", s.name, err)
		}
		for id := range rep.reached {
			delete(stale, id)
		}
		problems, notes := judge(rep, toolchain, accepted)
		fmt.Fprintf(out, "vulncheck %s: %s, %d advisories reached\n", s.name, rep.goVersion, len(rep.reached))
		for _, n := range notes {
			fmt.Fprintln(out, "  accepted:", n)
		}
		for _, p := range problems {
			fmt.Fprintln(out, "  FAIL:", p)
		}
		failed = failed || len(problems) > 0
	}
	for _, id := range sortedKeys(stale) {
		fmt.Fprintf(out, "note: %s is accepted in %s but no longer reached: remove it\n", id, acceptedPath)
	}
	if failed {
		return errors.New("reachable vulnerabilities (see FAIL lines); upgrade what they name, or list an advisory that has no fix in " + acceptedPath)
	}
	return nil
}

// report is what one govulncheck run found.
type report struct {
	goVersion string
	summaries map[string]string   // advisory ID -> summary
	reached   map[string]*finding // advisory ID -> the first finding at symbol level
}

// finding is one advisory that ebb's code calls into.
type finding struct {
	ID, Module, Version, Fixed string
	Symbol                     string
}

// message is govulncheck's JSON stream (its protocol v1.0.0), reduced to
// the fields read here.
type message struct {
	Config *struct {
		GoVersion string `json:"go_version"`
	} `json:"config"`
	// SBOM names the Go release in both modes (config only in source mode).
	SBOM *struct {
		GoVersion string `json:"go_version"`
	} `json:"SBOM"`
	OSV *struct {
		ID      string `json:"id"`
		Summary string `json:"summary"`
	} `json:"osv"`
	Finding *struct {
		OSV          string `json:"osv"`
		FixedVersion string `json:"fixed_version"`
		Trace        []struct {
			Module   string `json:"module"`
			Version  string `json:"version"`
			Package  string `json:"package"`
			Function string `json:"function"`
			Receiver string `json:"receiver"`
		} `json:"trace"`
	} `json:"finding"`
}

func govulncheck(ctx context.Context, db, dir, mode, target string) (report, error) {
	r, w := io.Pipe()
	var stderr strings.Builder
	cmd := scan.Command(ctx, "-db", db, "-C", dir, "-mode", mode, "-format", "json", target)
	cmd.Stdout, cmd.Stderr = w, &stderr
	if err := cmd.Start(); err != nil {
		return report{}, err
	}
	done := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		w.CloseWithError(io.EOF)
		done <- err
	}()
	rep, decodeErr := decode(r)
	_, _ = io.Copy(io.Discard, r) // let the scan finish writing whatever decode left
	if err := <-done; err != nil {
		return report{}, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return rep, decodeErr
}

// decode reads govulncheck's JSON stream. Only findings whose trace names a
// function count: a module- or package-level finding means ebb requires or
// imports the vulnerable code but never calls it.
func decode(r io.Reader) (report, error) {
	rep := report{summaries: map[string]string{}, reached: map[string]*finding{}}
	dec := json.NewDecoder(bufio.NewReader(r))
	for {
		var m message
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return rep, nil
		} else if err != nil {
			return rep, fmt.Errorf("reading govulncheck's output: %w", err)
		}
		switch {
		case m.Config != nil && m.Config.GoVersion != "":
			rep.goVersion = m.Config.GoVersion
		case m.SBOM != nil && m.SBOM.GoVersion != "":
			rep.goVersion = m.SBOM.GoVersion
		case m.OSV != nil:
			rep.summaries[m.OSV.ID] = m.OSV.Summary
		case m.Finding != nil && len(m.Finding.Trace) > 0 && m.Finding.Trace[0].Function != "":
			// One advisory can name several modules, some fixed and some
			// not (GO-2026-5932: x/crypto fixed, x/crypto/openpgp not):
			// whichever comes first, a fix anywhere makes it fixable.
			if seen, ok := rep.reached[m.Finding.OSV]; ok {
				if seen.Fixed != "" || m.Finding.FixedVersion == "" {
					continue
				}
			}
			f := m.Finding.Trace[0]
			symbol := f.Package + "." + f.Function
			if f.Receiver != "" {
				symbol = f.Package + "." + strings.TrimPrefix(f.Receiver, "*") + "." + f.Function
			}
			rep.reached[m.Finding.OSV] = &finding{ID: m.Finding.OSV, Module: f.Module, Version: f.Version, Fixed: m.Finding.FixedVersion, Symbol: symbol}
		}
	}
}

// judge says what fails and what is accepted, in a stable order.
func judge(rep report, toolchain string, accepted map[string]string) (problems, notes []string) {
	if rep.goVersion != toolchain {
		problems = append(problems, fmt.Sprintf("scanned with %s, but go.mod pins toolchain %s: the standard library's advisories were judged for the wrong release (build and scan with GOTOOLCHAIN=%s, as the Makefile does)", orNone(rep.goVersion), toolchain, toolchain))
	}
	for _, id := range sortedKeys(rep.reached) {
		f := rep.reached[id]
		what := fmt.Sprintf("%s (%s) in %s@%s, reached through %s", id, rep.summaries[id], f.Module, f.Version, f.Symbol)
		switch reason, ok := accepted[id]; {
		case f.Fixed != "":
			problems = append(problems, fmt.Sprintf("%s: fixed in %s", what, f.Fixed))
		case ok:
			notes = append(notes, fmt.Sprintf("%s: no fix released; %s", what, reason))
		default:
			problems = append(problems, fmt.Sprintf("%s: no fix released and not in the accepted list (add it with the mitigation, or stop calling it)", what))
		}
	}
	return problems, notes
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func orNone(s string) string {
	if s == "" {
		return "an unknown Go release"
	}
	return s
}

// pinnedToolchain reads go.mod's toolchain line (go1.27.3).
func pinnedToolchain(gomod string) (string, error) {
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", fmt.Errorf("reading the pinned toolchain: %w", err)
	}
	f, err := modfile.Parse(gomod, data, nil)
	if err != nil {
		return "", fmt.Errorf("reading the pinned toolchain: %w", err)
	}
	if f.Toolchain == nil {
		return "", fmt.Errorf("%s has no toolchain line: pin the Go release ebb is built with", gomod)
	}
	return f.Toolchain.Name, nil
}

// readAccepted reads lines "GO-YYYY-NNNN reason..."; # starts a comment.
func readAccepted(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the accepted advisories: %w", err)
	}
	accepted := map[string]string{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, reason, _ := strings.Cut(line, " ")
		if !strings.HasPrefix(id, "GO-") || strings.TrimSpace(reason) == "" {
			return nil, fmt.Errorf("%s:%d: want an advisory ID (GO-...) and the reason it is accepted", path, i+1)
		}
		accepted[id] = strings.TrimSpace(reason)
	}
	return accepted, nil
}
