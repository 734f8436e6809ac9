package metricsdoc

import (
	"encoding/json"
	"fmt"
	"os"
)

// DashboardQueries returns the PromQL expression of every target of every
// panel (rows' panels included) of a Grafana dashboard's JSON file, in
// order.
func DashboardQueries(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("reading dashboard %s: %w", path, err)
	}
	var out []string
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				if t.Expr != "" {
					out = append(out, t.Expr)
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out, nil
}

// panel is what DashboardQueries reads of a Grafana panel.
type panel struct {
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}
