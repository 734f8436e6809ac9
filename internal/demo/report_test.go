package demo

import (
	"os"
	"strings"
	"testing"
	"time"
)

// Markers close in time stack on separate rows; far apart they share the
// first row; every label says when; markers that did not happen are left
// out.
func TestMarkerLabelsDoNotOverlap(t *testing.T) {
	x := func(sec float64) float64 { return 50 + 840*sec/40 } // a 40 s run on a 900 px chart
	m := Markers{
		Drain: 3 * time.Second, FirstEviction: 3*time.Second + 40*time.Millisecond,
		NodeDown: 10 * time.Second, Drained: 10*time.Second + 200*time.Millisecond,
		NodeUp: 25 * time.Second, Complete: 25*time.Second + 100*time.Millisecond,
		End: 40 * time.Second,
	}
	labels := layoutMarkers(m, x)
	if len(labels) != 6 {
		t.Fatalf("%d labels, want 6: %+v", len(labels), labels)
	}
	for i, a := range labels {
		if !strings.HasSuffix(a.label, "s") || !strings.ContainsAny(a.label, "0123456789") {
			t.Errorf("label %q does not say when", a.label)
		}
		for _, b := range labels[i+1:] {
			aEnd := a.x + 3 + float64(len(a.label))*markerCharWidth
			bEnd := b.x + 3 + float64(len(b.label))*markerCharWidth
			if a.row == b.row && a.x < bEnd && b.x < aEnd {
				t.Errorf("%q and %q overlap on row %d", a.label, b.label, a.row)
			}
		}
	}
	rows := map[string]int{}
	for _, l := range labels {
		rows[l.label[:strings.LastIndex(l.label, " ")]] = l.row
	}
	if rows["drain"] == rows["first eviction"] || rows["node down"] == rows["drained"] || rows["node up"] == rows["complete"] {
		t.Errorf("markers a few ms apart share a row: %v", rows)
	}
	if rows["drain"] != 0 || rows["complete"] > 1 {
		t.Errorf("far-apart markers do not reuse the first rows: %v", rows)
	}

	// A baseline run has no Drained marker, nor a first eviction.
	got := layoutMarkers(Markers{Drain: time.Second, NodeDown: 5 * time.Second, End: 10 * time.Second}, x)
	if len(got) != 2 {
		t.Errorf("%d labels for 2 markers: %+v", len(got), got)
	}
}

// The LB host's maintenance has its own section in both reports, with a
// failure marked in the HTML one.
func TestReportsShowTheLBHostMaintenance(t *testing.T) {
	lb := &LBHostResult{Host: "node-2", Other: "node-1", RequestsSent: 1200, RequestsFailed: 1, LongLived: 4, TakeoverMs: 1180, DrainedSeconds: 6.4}
	var text strings.Builder
	WriteLBHostText(&text, lb)
	for _, want := range []string{"Maintaining node-2", "requests failed", "1 ", "0 of 4", "taken over by node-1 after", "1.2 s", "6.4 s"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
	path := t.TempDir() + "/report.html"
	r := &Result{Mode: "ebb <i>", Node: "node-3", Markers: Markers{End: 10 * time.Second}}
	if err := WriteHTML(path, lb, r); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "Maintaining a host of the load balancer itself (node-2)") || !strings.Contains(string(page), `<td class="bad">1</td>`) {
		t.Errorf("HTML report lacks the LB host section or its failure mark:\n%s", page)
	}
	if strings.Contains(string(page), "ebb <i>") || !strings.Contains(string(page), "ebb &lt;i&gt;") {
		t.Errorf("a name is not escaped in the HTML report:\n%s", page)
	}
}
