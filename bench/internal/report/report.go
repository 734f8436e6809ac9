// Package report holds what every benchmark does with its figures: the
// one-line JSON summary printed last and written to bench/results
// (percentiles and medians are in internal/stats, shared with the demo).
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

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
