package nodemaintenance

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Before any maintenance, every stage is exported at 0, so that a
// dashboard's "by stage" panel shows zeros rather than no data (seen
// empty in test/e2e/helm's evaluation of the dashboards).
func TestStagesAreExportedBeforeAnyMaintenance(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := NewMetrics(reg); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP ebb_nodemaintenance_maintenances NodeMaintenances by stage.
# TYPE ebb_nodemaintenance_maintenances gauge
ebb_nodemaintenance_maintenances{stage="Complete"} 0
ebb_nodemaintenance_maintenances{stage="Cordon"} 0
ebb_nodemaintenance_maintenances{stage="Drain"} 0
ebb_nodemaintenance_maintenances{stage="Idle"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ebb_nodemaintenance_maintenances"); err != nil {
		t.Error(err)
	}
}
