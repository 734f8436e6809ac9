package main

import (
	"slices"
	"strings"
	"testing"
)

// TestPairedSystemCostAlternatesAndEndsInTheLoadsState checks the order of
// the slices (ABBA), that prepare is told each slice's kind before it
// runs, and that it is told "load" once more at the end: the kernel
// engine's measurement left its notrack table in place for the next load
// when the last pair ended on a direct slice, and that load's connections
// through the engine timed out.
func TestPairedSystemCostAlternatesAndEndsInTheLoadsState(t *testing.T) {
	var ran []string
	base := func() (int64, int64) { ran = append(ran, "base"); return 1, 0 }
	load := func() (int64, int64) { ran = append(ran, "load"); return 1, 0 }
	var prepared []bool
	prepare := func(isLoad bool) error { prepared = append(prepared, isLoad); return nil }

	if _, err := pairedSystemCost(2, base, load, prepare); err != nil {
		t.Fatal(err)
	}
	if want := []string{"base", "load", "load", "base"}; !slices.Equal(ran, want) {
		t.Errorf("slices ran %v, want %v", ran, want)
	}
	if want := []bool{false, true, true, false, true}; !slices.Equal(prepared, want) {
		t.Errorf("prepare was told %v, want %v (each slice, then the load's state)", prepared, want)
	}
}

func TestPairedSystemCostRefusesAnEmptySlice(t *testing.T) {
	base := func() (int64, int64) { return 1, 0 }
	failing := func() (int64, int64) { return 0, 7 }
	_, err := pairedSystemCost(1, base, failing, nil)
	if err == nil || !strings.Contains(err.Error(), "no operation (7 failed)") {
		t.Errorf("got %v, want an error saying the slice completed no operation", err)
	}
}
