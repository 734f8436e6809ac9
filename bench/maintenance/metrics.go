package main

import (
	"fmt"
	"time"

	"github.com/ebbdev/ebb/bench/internal/scrape"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// counters are the controller's cumulative counts the bench reads.
type counters struct {
	// writes are the controller's requests to the apiserver that change
	// something (POST, PUT, PATCH, DELETE), from client-go's
	// rest_client_requests_total.
	writes float64
	// reconciles of the two maintenance controllers, from
	// controller_runtime_reconcile_total.
	nodeMaintenanceReconciles, evacuationReconciles float64
}

func (a counters) minus(b counters) counters {
	return counters{a.writes - b.writes, a.nodeMaintenanceReconciles - b.nodeMaintenanceReconciles, a.evacuationReconciles - b.evacuationReconciles}
}

func (a counters) perMinute(d time.Duration) counters {
	m := d.Minutes()
	return counters{a.writes / m, a.nodeMaintenanceReconciles / m, a.evacuationReconciles / m}
}

// readCounters reads the counters from `ebb controller`'s /metrics.
func readCounters() (counters, error) {
	f, err := scrape.Families(ebbrun.ControllerMetricsAddress)
	if err != nil {
		return counters{}, err
	}
	if _, ok := f["rest_client_requests_total"]; !ok {
		return counters{}, fmt.Errorf("ebb controller exports no rest_client_requests_total: cannot count its writes")
	}
	return counters{
		writes:                    scrape.Sum(f, "rest_client_requests_total", map[string][]string{"method": {"POST", "PUT", "PATCH", "DELETE"}}),
		nodeMaintenanceReconciles: scrape.Sum(f, "controller_runtime_reconcile_total", map[string][]string{"controller": {"nodemaintenance"}}),
		evacuationReconciles:      scrape.Sum(f, "controller_runtime_reconcile_total", map[string][]string{"controller": {"evacuation"}}),
	}, nil
}
