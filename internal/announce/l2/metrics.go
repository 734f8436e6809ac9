package l2

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	ownedDesc = prometheus.NewDesc("ebb_lb_l2_owned_addresses",
		"Load-balancer addresses this replica owns (answers ARP/NDP for) on its segment now.", nil, nil)
	offeredDesc = prometheus.NewDesc("ebb_lb_l2_offered_addresses",
		"Load-balancer addresses this replica offers to own (serves and may announce).", nil, nil)
	peersDesc = prometheus.NewDesc("ebb_lb_l2_peers",
		"Other replicas heard on the segment within the dead-after time.", nil, nil)
	takeoversDesc = prometheus.NewDesc("ebb_lb_l2_takeovers_total",
		"Addresses this replica took over (it then sends gratuitous ARP or unsolicited neighbour advertisements).", nil, nil)
)

// Collector returns a Prometheus collector of the announcer's state, read
// at each scrape.
func (a *Announcer) Collector() prometheus.Collector { return collector{a} }

type collector struct{ a *Announcer }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{ownedDesc, offeredDesc, peersDesc, takeoversDesc} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	c.a.mu.Lock()
	offered, peers := len(c.a.offer), len(c.a.live)
	c.a.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(ownedDesc, prometheus.GaugeValue, float64(len(*c.a.mine.Load())))
	ch <- prometheus.MustNewConstMetric(offeredDesc, prometheus.GaugeValue, float64(offered))
	ch <- prometheus.MustNewConstMetric(peersDesc, prometheus.GaugeValue, float64(peers))
	ch <- prometheus.MustNewConstMetric(takeoversDesc, prometheus.CounterValue, float64(c.a.takeovers.Load()))
}
