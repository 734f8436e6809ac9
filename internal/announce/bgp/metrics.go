package bgp

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	sessionUpDesc = prometheus.NewDesc("ebb_lb_bgp_session_up",
		"1 while the BGP session with the peer is established, 0 while not.", []string{"peer"}, nil)
	announcedDesc = prometheus.NewDesc("ebb_lb_bgp_announced_routes",
		"Routes this host announces by BGP now: host routes of load-balancer addresses, and aggregates (AnnouncementPolicy aggregationLength) each counted once.", nil, nil)
)

// Collector returns a Prometheus collector of the speaker's sessions and
// announcements, read at each scrape.
func (sp *Speaker) Collector() prometheus.Collector { return collector{sp} }

type collector struct{ sp *Speaker }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sessionUpDesc
	ch <- announcedDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if peers, err := c.sp.Peers(ctx); err == nil {
		for _, p := range peers {
			up := 0.0
			if p.Established {
				up = 1
			}
			ch <- prometheus.MustNewConstMetric(sessionUpDesc, prometheus.GaugeValue, up, p.Address.String())
		}
	}
	ch <- prometheus.MustNewConstMetric(announcedDesc, prometheus.GaugeValue, float64(c.sp.AnnouncedRoutes()))
}
