package demo

import (
	"bytes"
	"fmt"
	"html"
	"html/template"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// PerNode returns requests served per second by each node over [from, to).
func PerNode(r *Result, from, to time.Duration) map[string]float64 {
	out := map[string]float64{}
	secs := (to - from).Seconds()
	if secs <= 0 {
		return out
	}
	for _, s := range r.Samples {
		if s.At >= from && s.At < to && !s.Failed {
			out[s.Node]++
		}
	}
	for n := range out {
		out[n] /= secs
	}
	return out
}

// WriteText prints the plain report: the figures side by side, then the
// traffic per node before, during and after the maintenance.
func WriteText(w io.Writer, results ...*Result) {
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', tabwriter.AlignRight)
	head := "\t"
	for _, r := range results {
		head += r.Mode + "\t"
	}
	fmt.Fprintln(tw, head)
	row := func(name string, f func(r *Result) string) {
		line := name + "\t"
		for _, r := range results {
			line += f(r) + "\t"
		}
		fmt.Fprintln(tw, line)
	}
	row("requests sent", func(r *Result) string { return fmt.Sprint(r.RequestsSent) })
	row("requests failed", func(r *Result) string { return fmt.Sprint(r.RequestsFailed) })
	row("long-lived connections reset", func(r *Result) string { return fmt.Sprintf("%d of %d", r.ResetConnections, r.LongLivedOpened) })
	row("cutover (drain start -> last new connection to the node)", func(r *Result) string { return ms(r.CutoverMs) })
	row("drain duration", func(r *Result) string { return fmt.Sprintf("%.1f s", r.DrainSeconds) })
	row("p99 latency while the node drains and is down", func(r *Result) string { return ms(r.P99Ms) })
	_ = tw.Flush()
	for _, r := range results {
		m := r.Markers
		fmt.Fprintf(w, "\nRequests per second served by each node (%s; %s is maintained):\n", r.Mode, r.Node)
		tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "node\tbefore\tduring\tafter\t")
		before, during, after := PerNode(r, 0, m.Drain), PerNode(r, m.Drain, m.Complete), PerNode(r, m.Complete, m.End)
		for _, n := range r.Nodes {
			fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t\n", n, before[n], during[n], after[n])
		}
		_ = tw.Flush()
	}
}

// WriteLBHostText prints what the clients noticed while an LB host was
// maintained.
func WriteLBHostText(w io.Writer, lb *LBHostResult) {
	fmt.Fprintf(w, "\nMaintaining %s, a host of the load balancer itself (ebb lb on it and on %s, announcing by ARP):\n", lb.Host, lb.Other)
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', tabwriter.AlignRight)
	for _, r := range lbHostRows(lb) {
		fmt.Fprintf(tw, "%s\t%s\t\n", r.name, r.value)
	}
	_ = tw.Flush()
}

type lbHostRow struct {
	name, value string
	bad         bool
}

func lbHostRows(lb *LBHostResult) []lbHostRow {
	return []lbHostRow{
		{"requests sent", fmt.Sprint(lb.RequestsSent), false},
		{"requests failed", fmt.Sprint(lb.RequestsFailed), lb.RequestsFailed > 0},
		{"long-lived connections reset", fmt.Sprintf("%d of %d", lb.LongLivedBroken, lb.LongLived), lb.LongLivedBroken > 0},
		{"address taken over by " + lb.Other + " after", ms(lb.TakeoverMs), false},
		{"maintenance Drained after (the host's connections and pods gone)", fmt.Sprintf("%.1f s", lb.DrainedSeconds), false},
	}
}

func ms(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.1f s", v/1000)
	}
	return fmt.Sprintf("%.0f ms", v)
}

// WriteHTML writes a self-contained report: the figures and, per run, a
// chart of requests per second per node over time (inline SVG, no script),
// and the LB host's maintenance when there was one (lb may be nil).
func WriteHTML(path string, lb *LBHostResult, results ...*Result) error {
	page := htmlPage{Results: results}
	cell := func(f func(r *Result) string, bad func(r *Result) bool) []htmlCell {
		var out []htmlCell
		for _, r := range results {
			out = append(out, htmlCell{Value: f(r), Bad: bad != nil && bad(r)})
		}
		return out
	}
	page.Rows = []htmlRow{
		{"requests sent", cell(func(r *Result) string { return fmt.Sprint(r.RequestsSent) }, nil)},
		{"requests failed", cell(func(r *Result) string { return fmt.Sprint(r.RequestsFailed) }, func(r *Result) bool { return r.RequestsFailed > 0 })},
		{"long-lived connections reset", cell(func(r *Result) string { return fmt.Sprintf("%d of %d", r.ResetConnections, r.LongLivedOpened) }, func(r *Result) bool { return r.ResetConnections > 0 })},
		{"cutover", cell(func(r *Result) string { return ms(r.CutoverMs) }, nil)},
		{"drain duration", cell(func(r *Result) string { return fmt.Sprintf("%.1f s", r.DrainSeconds) }, nil)},
		{"p99 latency (drain and downtime)", cell(func(r *Result) string { return ms(r.P99Ms) }, nil)},
	}
	// The runs side by side (wrapping on a narrow screen): the comparison
	// is the point of the first screen.
	width := 900.0
	if len(results) > 1 {
		width = 620
	}
	for _, r := range results {
		// chart escapes the names it writes itself.
		page.Charts = append(page.Charts, htmlChart{Mode: r.Mode, Node: r.Node, SVG: template.HTML(chart(r, width))})
	}
	if lb != nil {
		page.LBHost = lb.Host
		for _, r := range lbHostRows(lb) {
			page.LBRows = append(page.LBRows, htmlRow{Name: r.name, Cells: []htmlCell{{Value: r.value, Bad: r.bad}}})
		}
	}
	var b bytes.Buffer
	if err := reportTemplate.Execute(&b, page); err != nil {
		return fmt.Errorf("rendering the HTML report: %w", err)
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// htmlPage is what reportTemplate renders.
type htmlPage struct {
	Results []*Result
	Rows    []htmlRow
	Charts  []htmlChart
	LBHost  string
	LBRows  []htmlRow
}

type htmlRow struct {
	Name  string
	Cells []htmlCell
}

type htmlCell struct {
	Value string
	Bad   bool
}

type htmlChart struct {
	Mode, Node string
	SVG        template.HTML
}

var reportTemplate = template.Must(template.New("report").Parse(`<!doctype html><html><head><meta charset="utf-8"><title>ebb demo: draining a node under traffic</title>
<style>body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse}td,th{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child{text-align:left}svg{background:#fafafa;border:1px solid #ddd}.bad{color:#c00;font-weight:bold}</style>
</head><body><h1>Draining a node under traffic</h1>
<table><tr><th></th>{{range .Results}}<th>{{.Mode}}</th>{{end}}</tr>
{{range .Rows}}<tr><td>{{.Name}}</td>{{range .Cells}}<td{{if .Bad}} class="bad"{{end}}>{{.Value}}</td>{{end}}</tr>
{{end}}</table>
<div style="display:flex;flex-wrap:wrap;gap:1.5em">
{{range .Charts}}<div><h2>{{.Mode}}: requests per second by serving node ({{.Node}} is maintained)</h2>{{.SVG}}</div>
{{end}}</div>
{{if .LBHost}}<h2>Maintaining a host of the load balancer itself ({{.LBHost}})</h2><table>
{{range .LBRows}}<tr><td>{{.Name}}</td>{{range .Cells}}<td{{if .Bad}} class="bad"{{end}}>{{.Value}}</td>{{end}}</tr>
{{end}}</table>
{{end}}</body></html>
`))

// markerRowHeight is the height of one row of marker labels; a label's
// width is estimated from its length at font-size 10.
const (
	markerRowHeight = 11.0
	markerCharWidth = 5.6
)

// markerLabel is a marker placed on the chart.
type markerLabel struct {
	label string
	x     float64
	row   int
}

// layoutMarkers places the scenario's markers (those that happened) in
// time order, each label on the first row where it does not overlap the
// label before it: markers a few milliseconds apart (the drain and the
// first eviction, the node going down and Drained) stack instead of
// printing over each other. Each label carries its time.
func layoutMarkers(m Markers, x func(sec float64) float64) []markerLabel {
	marks := []struct {
		at    time.Duration
		label string
	}{{m.Drain, "drain"}, {m.FirstEviction, "first eviction"}, {m.Drained, "drained"}, {m.NodeDown, "node down"}, {m.NodeUp, "node up"}, {m.Complete, "complete"}}
	sort.SliceStable(marks, func(i, j int) bool { return marks[i].at < marks[j].at })
	var out []markerLabel
	var rowEnds []float64 // the x where each row's last label ends
	for _, mk := range marks {
		if mk.at == 0 {
			continue
		}
		l := markerLabel{label: fmt.Sprintf("%s %.1fs", mk.label, mk.at.Seconds()), x: x(mk.at.Seconds())}
		start, end := l.x+3, l.x+3+float64(len(l.label))*markerCharWidth
		l.row = len(rowEnds)
		for i, e := range rowEnds {
			if start > e+4 {
				l.row = i
				break
			}
		}
		if l.row == len(rowEnds) {
			rowEnds = append(rowEnds, end)
		} else {
			rowEnds[l.row] = end
		}
		out = append(out, l)
	}
	return out
}

var palette = []string{"#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#bcbd22"}

// chart draws requests per second per node, failures in red, and the
// scenario's markers.
func chart(r *Result, w float64) string {
	const h, left, bottom, top = 320.0, 50.0, 30.0, 20.0
	secs := int(math.Ceil(r.Markers.End.Seconds()))
	if secs < 1 {
		secs = 1
	}
	series := map[string][]float64{}
	failed := make([]float64, secs+1)
	for _, n := range r.Nodes {
		series[n] = make([]float64, secs+1)
	}
	peak := 1.0
	for _, s := range r.Samples {
		i := int(s.At.Seconds())
		if i > secs {
			continue
		}
		if s.Failed {
			failed[i]++
			peak = math.Max(peak, failed[i])
			continue
		}
		if v, ok := series[s.Node]; ok {
			v[i]++
			peak = math.Max(peak, v[i])
		}
	}
	x := func(sec float64) float64 { return left + (w-left-10)*sec/float64(secs) }
	y := func(v float64) float64 { return h - bottom - (h-bottom-top)*v/peak }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f">`, w, h, w, h)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#888"/>`, left, h-bottom, w-10, h-bottom)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="11">%.0f/s</text><text x="%.0f" y="%.0f" font-size="11">0</text>`, 5.0, top+4, peak, 30.0, h-bottom)
	for t := 0; t <= secs; t += max(secs/10, 1) {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" font-size="11" text-anchor="middle">%ds</text>`, x(float64(t)), h-bottom+15, t)
	}
	poly := func(vals []float64, color, dash string) {
		var pts []string
		for i, v := range vals {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(float64(i)+0.5), y(v)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" %s points="%s"/>`, color, dash, strings.Join(pts, " "))
	}
	for i, n := range r.Nodes {
		poly(series[n][:secs], palette[i%len(palette)], "")
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="12" fill="%s">%s</text>`, left+10+float64(i)*110, top-5, palette[i%len(palette)], html.EscapeString(n))
	}
	poly(failed[:secs], "#d62728", `stroke-dasharray="4 3"`)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="12" fill="#d62728">failed</text>`, left+10+float64(len(r.Nodes))*110, top-5)
	for _, l := range layoutMarkers(r.Markers, x) {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#555" stroke-dasharray="2 3"/>`, l.x, top+float64(l.row)*markerRowHeight, l.x, h-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" font-size="10" fill="#555">%s</text>`, l.x+3, top+10+float64(l.row)*markerRowHeight, html.EscapeString(l.label))
	}
	b.WriteString("</svg>")
	return b.String()
}
