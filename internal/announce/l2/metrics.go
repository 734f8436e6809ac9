package l2

import (
	"strconv"

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
	refusedDesc = prometheus.NewDesc("ebb_lb_l2_heartbeats_refused_total",
		"Heartbeat frames refused: unauthenticated (unsigned, or signed with a key this replica does not have), replayed, malformed, or too_many_peers.", []string{"reason"}, nil)
	acceptedDesc = prometheus.NewDesc("ebb_lb_l2_heartbeats_accepted_total",
		"Heartbeat frames of other replicas of this class heard on the segment and accepted (signed with a known key, not replayed).", nil, nil)
	keyDesc = prometheus.NewDesc("ebb_lb_l2_heartbeat_key_info",
		"The heartbeat keys this replica accepts (1 each; fingerprint: the first 8 hex digits of the key's SHA-256), and which one it signs with: check that every replica has a new key before signing with it.", []string{"id", "fingerprint", "signing"}, nil)
)

// Collector returns a Prometheus collector of the announcer's state, read
// at each scrape.
func (a *Announcer) Collector() prometheus.Collector { return collector{a} }

type collector struct{ a *Announcer }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{ownedDesc, offeredDesc, peersDesc, takeoversDesc, acceptedDesc, refusedDesc, keyDesc} {
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
	ch <- prometheus.MustNewConstMetric(acceptedDesc, prometheus.CounterValue, float64(c.a.accepted.Load()))
	for _, reason := range refusedReasons {
		ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(c.a.refused[reason].Load()), reason)
	}
	if k := c.a.keys.Load(); k != nil {
		for _, id := range k.IDs() {
			ch <- prometheus.MustNewConstMetric(keyDesc, prometheus.GaugeValue, 1, id, k.fingerprint(id), strconv.FormatBool(id == k.SigningID()))
		}
	}
}
