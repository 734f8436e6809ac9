// Package report holds what every benchmark does with its figures:
// percentiles, and the one-line JSON summary printed last and written to
// bench/results.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// Percentile returns the p-quantile (0..1) of d, which it does not modify;
// 0 for no samples.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// WriteSummary writes summary as one JSON line to out and prints it as the
// benchmark's last line.
func WriteSummary(out string, summary map[string]any) error {
	line, err := json.Marshal(summary)
	if err != nil {
		return fmt.Errorf("encoding the summary: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(out, append(line, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Println(string(line))
	return nil
}
