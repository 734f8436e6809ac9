package demo

import (
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
