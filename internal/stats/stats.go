// Package stats holds the order statistics ebb's benchmarks and demo
// report, computed one way everywhere.
package stats

import (
	"slices"
	"time"
)

// Percentile returns the p-th quantile (0 <= p <= 1) of d by the nearest
// rank below: the element at index floor(p*n) of the sorted values, the
// largest for p = 1; 0 when d is empty. d is not changed.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, max(0, int(p*float64(len(s)))))]
}

// Median returns the middle value of v (the upper one of an even count);
// 0 when v is empty. v is not changed.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
