package main

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/ebbdev/ebb/bench/internal/scrape"
	"github.com/ebbdev/ebb/internal/localcluster"
	"github.com/ebbdev/ebb/internal/localcluster/ebbrun"
)

// counters are the controller's counts over a window.
type counters struct {
	// writes are the controller's requests to the apiserver that change
	// something (POST, PUT, PATCH, DELETE), from client-go's
	// rest_client_requests_total, less the leader Lease's renewals.
	writes float64
	// leaseWrites are the renewals of the leader Lease (one PUT every
	// retry period whatever the controller does), counted by watching it.
	leaseWrites float64
	// reconciles of the two maintenance controllers, from
	// controller_runtime_reconcile_total.
	nodeMaintenanceReconciles, evacuationReconciles float64
}

func (a counters) minus(b counters) counters {
	return counters{a.writes - b.writes, a.leaseWrites - b.leaseWrites, a.nodeMaintenanceReconciles - b.nodeMaintenanceReconciles, a.evacuationReconciles - b.evacuationReconciles}
}

func (a counters) perMinute(d time.Duration) counters {
	m := d.Minutes()
	return counters{a.writes / m, a.leaseWrites / m, a.nodeMaintenanceReconciles / m, a.evacuationReconciles / m}
}

// measure runs do and returns the leading controller's counts while it
// ran. The leader must not change meanwhile (its counters start at 0).
func measure(ctx context.Context, c *localcluster.Cluster, do func() error) (counters, error) {
	w, err := c.Client.CoordinationV1().Leases(ebbrun.Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=ebb-controller"})
	if err != nil {
		return counters{}, fmt.Errorf("watching the controller's leader Lease: %w", err)
	}
	defer w.Stop()
	leaseWrites := make(chan int, 1)
	go func() {
		n := 0
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified {
				n++
			}
		}
		leaseWrites <- n
	}()
	before, err := readCounters(ctx, c)
	if err != nil {
		return counters{}, err
	}
	if err := do(); err != nil {
		return counters{}, err
	}
	after, err := readCounters(ctx, c)
	if err != nil {
		return counters{}, err
	}
	w.Stop()
	diff := after.minus(before)
	diff.leaseWrites = float64(<-leaseWrites)
	diff.writes -= diff.leaseWrites
	return diff, nil
}

// readCounters reads the counters from the leading ebb controller's
// /metrics (the other replica only waits for the Lease).
func readCounters(ctx context.Context, c *localcluster.Cluster) (counters, error) {
	page, err := ebbrun.ControllerPage(ctx, c, "/metrics")
	if err != nil {
		return counters{}, err
	}
	f, err := scrape.Parse(page)
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
