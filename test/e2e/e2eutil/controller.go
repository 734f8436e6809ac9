package e2eutil

import (
	"context"
	"testing"

	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// ControllerMetrics reads the metrics of the leading replica of an
// installed ebb controller, inside its pod's network namespace.
func ControllerMetrics(t *testing.T, ctx context.Context, c *localcluster.Cluster) string {
	t.Helper()
	page, err := ebbrun.ControllerPage(ctx, c, "/metrics")
	if err != nil {
		t.Fatalf("scraping the controller: %v", err)
	}
	return page
}
