package main

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	v1alpha1 "github.com/ebbdev/ebb/api/v1alpha1"
	clustercmd "github.com/ebbdev/ebb/internal/cmd/cluster"
)

func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}

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

// scrape reads the counters from `ebb controller`'s /metrics.
func scrape() (counters, error) {
	resp, err := http.Get("http://" + clustercmd.ControllerMetricsAddress + "/metrics")
	if err != nil {
		return counters{}, fmt.Errorf("scraping ebb controller: %w", err)
	}
	defer resp.Body.Close()
	return parse(resp.Body)
}

func parse(r io.Reader) (counters, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return counters{}, fmt.Errorf("parsing ebb controller's metrics: %w", err)
	}
	var c counters
	if f, ok := families["rest_client_requests_total"]; ok {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "method" && slices.Contains([]string{"POST", "PUT", "PATCH", "DELETE"}, l.GetValue()) {
					c.writes += m.GetCounter().GetValue()
				}
			}
		}
	} else {
		return c, fmt.Errorf("ebb controller exports no rest_client_requests_total")
	}
	if f, ok := families["controller_runtime_reconcile_total"]; ok {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				switch {
				case l.GetName() != "controller":
				case l.GetValue() == "nodemaintenance":
					c.nodeMaintenanceReconciles += m.GetCounter().GetValue()
				case l.GetValue() == "evacuation":
					c.evacuationReconciles += m.GetCounter().GetValue()
				}
			}
		}
	}
	return c, nil
}
