// Package metricsdoc reads, from ebb's source, every Prometheus metric its
// components define (name, type, labels, help) and writes
// docs/metrics.md from them, so that the reference cannot drift from the
// code: a test fails when the page is out of date, and when an alert rule
// names a metric no component defines.
package metricsdoc

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Metric is one metric as its source defines it.
type Metric struct {
	Name string
	// Type is counter, gauge, histogram or summary.
	Type      string
	Labels    []string
	Help      string
	Component string
	// Source is the file that defines it, relative to the root.
	Source string
	// descVar names the variable or field a NewDesc is kept in, whose
	// MustNewConstMetric calls give its type.
	descVar string
}

// components maps where a metric is defined to the process that serves
// it; packages not listed (the local cluster, the demo, benchmarks) are
// test tooling, not ebb.
var components = []struct{ prefix, component string }{
	{"internal/controller/", "ebb controller"},
	{"internal/webhook/", "ebb controller"},
	{"internal/provider/azure/", "ebb controller"},
	{"internal/cmd/nodeagent/", "ebb node-agent"},
	{"internal/nodehealth/", "ebb node-agent"},
	{"internal/cmd/lb/", "ebb lb"},
	{"internal/dataplane/", "ebb lb"},
	{"internal/announce/", "ebb lb"},
	{"internal/lbsync/", "ebb lb"},
	{"internal/vipguard/", "ebb lb"},
	{"internal/flowfwd/", "ebb lb"},
}

// exclusions are packages of test tooling, whose metrics are not ebb's.
var exclusions = []string{"internal/localcluster/", "internal/demo/", "internal/cmd/demo/"}

func excluded(rel string) bool {
	return slices.ContainsFunc(exclusions, func(p string) bool { return strings.HasPrefix(rel, p) })
}

func componentOf(rel string) string {
	for _, c := range components {
		if strings.HasPrefix(rel, c.prefix) {
			return c.component
		}
	}
	return ""
}

// Extract reads the non-test Go files under root/internal and returns
// their metrics, sorted by component and name.
func Extract(root string) ([]Metric, error) {
	byDir := map[string][]string{}
	err := filepath.WalkDir(filepath.Join(root, "internal"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			byDir[filepath.Dir(path)] = append(byDir[filepath.Dir(path)], path)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []Metric
	fset := token.NewFileSet()
	for dir, paths := range byDir {
		relDir, err := filepath.Rel(root, dir)
		if err != nil {
			return nil, err
		}
		slashed := filepath.ToSlash(relDir) + "/"
		component := componentOf(slashed)
		if component == "" && excluded(slashed) {
			continue
		}
		files := map[string]*ast.File{}
		for _, path := range paths {
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return nil, fmt.Errorf("parsing %s: %w", path, err)
			}
			files[path] = f
		}
		pkgVars, types := packageVars(files), constMetricTypes(files)
		for path, f := range files {
			rel, _ := filepath.Rel(root, path)
			ms, err := fromFile(f, pkgVars)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", filepath.ToSlash(rel), err)
			}
			if len(ms) > 0 && component == "" {
				return nil, fmt.Errorf("%s defines metrics (%s) but serves in no component: add its package to metricsdoc's components, or to its exclusions if it is test tooling", filepath.ToSlash(rel), ms[0].Name)
			}
			for _, m := range ms {
				if m.descVar != "" {
					if t, ok := types[m.descVar]; ok {
						m.Type = t
					}
					m.descVar = ""
				}
				m.Component, m.Source = component, filepath.ToSlash(rel)
				out = append(out, m)
			}
		}
	}
	slices.SortFunc(out, func(a, b Metric) int {
		return strings.Compare(a.Component+" "+a.Name, b.Component+" "+b.Name)
	})
	for i := 1; i < len(out); i++ {
		if out[i].Name == out[i-1].Name && out[i].Component == out[i-1].Component {
			return nil, fmt.Errorf("metric %s defined twice (%s, %s)", out[i].Name, out[i-1].Source, out[i].Source)
		}
	}
	return out, nil
}

// packageVars are the package-level variables of files set to a
// []string literal.
func packageVars(files map[string]*ast.File) map[string]ast.Expr {
	var specs []ast.Node
	for _, f := range files {
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok {
				specs = append(specs, g)
			}
		}
	}
	return stringSliceVars(specs...)
}

// fromFile finds prometheus.NewDesc("name", "help", labels, ...) and
// prometheus.New<Type>[Vec](prometheus.<Type>Opts{Name: ..., Help: ...},
// labels) in a file. A metric whose name or help is not a constant
// string is an error: the reference could not say what it is.
func fromFile(f *ast.File, pkgVars map[string]ast.Expr) ([]Metric, error) {
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		switch {
		case path == "github.com/prometheus/client_golang/prometheus" && imp.Name != nil && imp.Name.Name != "prometheus":
			return nil, fmt.Errorf("imports the Prometheus client as %s: metricsdoc reads prometheus.New... calls only", imp.Name.Name)
		case path == "github.com/prometheus/client_golang/prometheus/promauto":
			return nil, fmt.Errorf("uses promauto: metricsdoc reads prometheus.New... calls only")
		}
	}
	var out []Metric
	for _, d := range f.Decls {
		// A function's own variables, over the package's.
		vars := pkgVars
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
			vars = map[string]ast.Expr{}
			maps.Copy(vars, pkgVars)
			maps.Copy(vars, stringSliceVars(fd.Body))
		}
		ms, err := fromDecl(d, vars)
		if err != nil {
			return nil, err
		}
		out = append(out, ms...)
	}
	return out, nil
}

// fromDecl is fromFile for one declaration, with the []string variables
// it sees.
func fromDecl(decl ast.Decl, vars map[string]ast.Expr) ([]Metric, error) {
	var out []Metric
	var err error
	// bound names the variable or field each NewDesc call is kept in.
	bound := map[*ast.CallExpr]string{}
	ast.Inspect(decl, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ValueSpec:
			for i, v := range n.Values {
				if c, ok := v.(*ast.CallExpr); ok && i < len(n.Names) {
					bound[c] = n.Names[i].Name
				}
			}
		case *ast.AssignStmt:
			for i, v := range n.Rhs {
				if c, ok := v.(*ast.CallExpr); ok && i < len(n.Lhs) {
					bound[c] = lastName(n.Lhs[i])
				}
			}
		case *ast.KeyValueExpr:
			if c, ok := n.Value.(*ast.CallExpr); ok {
				bound[c] = lastName(n.Key)
			}
		}
		return true
	})
	ast.Inspect(decl, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || err != nil {
			return err == nil
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "prometheus" {
			return true
		}
		var m Metric
		switch fn := sel.Sel.Name; {
		case fn == "NewDesc" && len(call.Args) >= 3:
			m.Name, err = stringOf(call.Args[0])
			if err == nil {
				m.Help, err = stringOf(call.Args[1])
			}
			var ok bool
			if m.Labels, ok = stringsOf(call.Args[2], vars); !ok && err == nil {
				err = fmt.Errorf("labels of %s: not a []string literal, a variable set to one, or an append to one", m.Name)
			}
			// A Desc's type is where a collector uses it
			// (MustNewConstMetric's value type, set by Extract); without
			// one, by Prometheus' naming: counters end in _total.
			m.Type, m.descVar = "gauge", bound[call]
			if strings.HasSuffix(m.Name, "_total") {
				m.Type = "counter"
			}
		case strings.HasPrefix(fn, "New") && metricType(fn) != "" && len(call.Args) >= 1:
			lit, ok := call.Args[0].(*ast.CompositeLit)
			if !ok {
				err = fmt.Errorf("options not a literal: metricsdoc cannot read the metric's name")
				break
			}
			m.Type = metricType(fn)
			for _, e := range lit.Elts {
				kv, ok := e.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				key, _ := kv.Key.(*ast.Ident)
				if key == nil {
					continue
				}
				switch key.Name {
				case "Name":
					m.Name, err = stringOf(kv.Value)
				case "Help":
					m.Help, err = stringOf(kv.Value)
				case "Namespace", "Subsystem":
					err = fmt.Errorf("metric options with %s: write the whole name in Name", key.Name)
				}
				if err != nil {
					return false
				}
			}
			if strings.HasSuffix(fn, "Vec") && len(call.Args) >= 2 {
				var ok bool
				if m.Labels, ok = stringsOf(call.Args[1], vars); !ok {
					err = fmt.Errorf("labels of %s: not a []string literal, a variable set to one, or an append to one", m.Name)
				}
			}
		default:
			return true
		}
		if err == nil && m.Name == "" {
			err = fmt.Errorf("no Name: metricsdoc cannot list the metric")
		}
		if err != nil {
			err = fmt.Errorf("prometheus.%s at offset %d: %w", sel.Sel.Name, call.Pos(), err)
			return false
		}
		out = append(out, m)
		return true
	})
	return out, err
}

// metricType is the type a prometheus.New<Type>[Vec|Func] constructor makes
// ("" for other functions).
func metricType(fn string) string {
	kind := strings.TrimPrefix(fn, "New")
	kind = strings.TrimSuffix(strings.TrimSuffix(kind, "Vec"), "Func")
	switch kind {
	case "Counter":
		return "counter"
	case "Gauge":
		return "gauge"
	case "Histogram":
		return "histogram"
	case "Summary":
		return "summary"
	case "Untyped":
		return "untyped"
	}
	return ""
}

// lastName is the identifier an expression ends in (x, a.b.x).
func lastName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return e.Sel.Name
	}
	return ""
}

// constMetricTypes maps, in a package, the variables and fields that
// prometheus.MustNewConstMetric and NewConstMetric take a Desc from to the
// value type they give it.
func constMetricTypes(files map[string]*ast.File) map[string]string {
	out := map[string]string{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "MustNewConstMetric" && sel.Sel.Name != "NewConstMetric") {
				return true
			}
			switch lastName(call.Args[1]) {
			case "CounterValue":
				out[lastName(call.Args[0])] = "counter"
			case "GaugeValue":
				out[lastName(call.Args[0])] = "gauge"
			case "UntypedValue":
				out[lastName(call.Args[0])] = "untyped"
			}
			return true
		})
	}
	return out
}

// stringOf is the value of a string literal or a + of them.
func stringOf(e ast.Expr) (string, error) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			return strconv.Unquote(e.Value)
		}
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			a, err := stringOf(e.X)
			if err != nil {
				return "", err
			}
			b, err := stringOf(e.Y)
			return a + b, err
		}
	case *ast.ParenExpr:
		return stringOf(e.X)
	}
	return "", fmt.Errorf("not a constant string")
}

// stringsOf is the values of a []string{...} literal, of a variable of
// the file set to one (vars), or of an append of strings to either; nil
// is no labels. ok is false for anything else.
func stringsOf(e ast.Expr, vars map[string]ast.Expr) (out []string, ok bool) {
	switch e := e.(type) {
	case *ast.CompositeLit:
		for _, el := range e.Elts {
			s, err := stringOf(el)
			if err != nil {
				return nil, false
			}
			out = append(out, s)
		}
		return out, true
	case *ast.Ident:
		if e.Name == "nil" {
			return nil, true
		}
		if v, found := vars[e.Name]; found {
			return stringsOf(v, nil)
		}
	case *ast.CallExpr:
		if fn, isIdent := e.Fun.(*ast.Ident); isIdent && fn.Name == "append" && len(e.Args) > 0 && e.Ellipsis == token.NoPos {
			out, ok = stringsOf(e.Args[0], vars)
			for _, a := range e.Args[1:] {
				s, err := stringOf(a)
				if err != nil {
					return nil, false
				}
				out = append(out, s)
			}
			return out, ok
		}
	}
	return nil, false
}

// stringSliceVars are the variables in nodes set once to a []string
// literal (name := []string{...}, var name = []string{...}); a name set
// twice is left out, as its value depends on where it is read.
func stringSliceVars(nodes ...ast.Node) map[string]ast.Expr {
	vars := map[string]ast.Expr{}
	seen := map[string]int{}
	add := func(name *ast.Ident, v ast.Expr) {
		seen[name.Name]++
		if lit, ok := v.(*ast.CompositeLit); ok {
			vars[name.Name] = lit
		}
	}
	inspect := func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			for i, l := range n.Lhs {
				if id, ok := l.(*ast.Ident); ok && i < len(n.Rhs) {
					add(id, n.Rhs[i])
				}
			}
		case *ast.ValueSpec:
			for i, id := range n.Names {
				if i < len(n.Values) {
					add(id, n.Values[i])
				}
			}
		}
		return true
	}
	for _, n := range nodes {
		ast.Inspect(n, inspect)
	}
	for name, n := range seen {
		if n > 1 {
			delete(vars, name)
		}
	}
	return vars
}

// Render writes the reference page.
func Render(metrics []Metric) string {
	var b strings.Builder
	b.WriteString(`# Metrics

Every Prometheus metric ebb's own code defines, by the process that
serves it. Generated from the source by ` + "`internal/metricsdoc`" + `
(` + "`go test ./internal/metricsdoc -update-metrics-doc`" + `); a test fails
when this page is out of date, and when an alert rule in
` + "`config/monitoring/rules.yaml`" + ` names a metric that no component defines.

Where they are served: ` + "`ebb lb`" + ` on ` + "`--metrics-bind-address`" + `
(` + "`127.0.0.1:9464`" + ` in the install, on each LB host's network), the
controller on its ` + "`--metrics-bind-address`" + ` (` + "`127.0.0.1:8080`" + ` in its pod)
and ` + "`ebb node-agent`" + ` on its ` + "`--metrics-bind-address`" + `
(` + "`127.0.0.1:9465`" + `), unauthenticated; and, with
` + "`config/components/servicemonitor`" + `, all three over HTTPS on
` + "`--secure-metrics-bind-address`" + ` (` + "`:8443`" + `, and ` + "`:9474`" + ` and ` + "`:9475`" + ` on
the node's address) to callers the API server authorizes for GET
` + "`/metrics`" + `; docs/alerts.md says how to scrape them. Besides
these, ` + "`ebb lb`" + ` and the controller serve the Go runtime's and the
process's own metrics (` + "`go_*`" + `, ` + "`process_*`" + `), and the controller
controller-runtime's (` + "`controller_runtime_*`" + `, ` + "`workqueue_*`" + `,
` + "`rest_client_*`" + `).

A histogram is also served as its ` + "`_bucket`, `_sum` and `_count`" + ` series.
`)
	component := ""
	for _, m := range metrics {
		if m.Component != component {
			component = m.Component
			fmt.Fprintf(&b, "\n## %s\n\n| metric | type | labels | meaning |\n|---|---|---|---|\n", component)
		}
		labels := "—"
		if len(m.Labels) > 0 {
			labels = "`" + strings.Join(m.Labels, "`, `") + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", m.Name, m.Type, labels, strings.ReplaceAll(m.Help, "|", `\|`))
	}
	return b.String()
}
