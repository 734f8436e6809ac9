package stats

import (
	"testing"
	"time"
)

func TestPercentileAndMedian(t *testing.T) {
	d := []time.Duration{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	for _, tt := range []struct {
		p    float64
		want time.Duration
	}{{0, 1}, {0.5, 6}, {0.9, 10}, {0.99, 10}, {1, 10}} {
		if got := Percentile(d, tt.p); got != tt.want {
			t.Errorf("Percentile(%v) = %v, want %v", tt.p, got, tt.want)
		}
	}
	if d[0] != 5 {
		t.Error("Percentile sorted its input")
	}
	if Percentile(nil, 0.5) != 0 || Median(nil) != 0 {
		t.Error("empty input")
	}
	if got := Median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("Median odd = %v", got)
	}
	if got := Median([]float64{4, 1, 3, 2}); got != 3 {
		t.Errorf("Median even = %v, want the upper middle 3", got)
	}
}
