package e2eutil

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Scrape reads a Prometheus /metrics page at address.
func Scrape(t *testing.T, address string) string {
	t.Helper()
	resp, err := http.Get("http://" + address + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// AdminDown reports whether every backend of node on the load balancer
// whose metrics page is given is admin Down (false when it has none).
func AdminDown(page, node string) bool {
	down, seen := 0, 0
	for _, l := range strings.Split(page, "\n") {
		if strings.HasPrefix(l, "ebb_dataplane_backend_admin_state{") && strings.Contains(l, `owner="`+node+`"`) && strings.Contains(l, `state="Down"`) {
			seen++
			if strings.HasSuffix(l, " 1") {
				down++
			}
		}
	}
	return seen > 0 && down == seen
}

// Sum adds up every sample of a metric on a /metrics page.
func Sum(page, metric string) float64 {
	total := 0.0
	for _, l := range strings.Split(page, "\n") {
		if !strings.HasPrefix(l, metric+"{") && !strings.HasPrefix(l, metric+" ") {
			continue
		}
		if i := strings.LastIndex(l, " "); i > 0 {
			if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
				total += v
			}
		}
	}
	return total
}
