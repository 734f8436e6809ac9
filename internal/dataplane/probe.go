package dataplane

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// probeKey identifies one probe loop. Backends that share a target and
// settings (every Service's backend on one node probing the node's health
// port) share one prober.
type probeKey struct {
	target    netip.AddrPort
	protocol  ProbeProtocol
	path      string
	interval  time.Duration
	timeout   time.Duration
	unhealthy int
	healthy   int
}

func (k probeKey) String() string {
	if k.protocol == ProbeHTTP {
		return "http://" + k.target.String() + k.path
	}
	return "tcp://" + k.target.String()
}

// probeKeyFor returns the probe of backend b under health check hc.
func probeKeyFor(hc *HealthCheck, b Backend) probeKey {
	addr := b.AddrPort().Addr()
	if b.ProbeAddress != "" {
		addr, _ = netip.ParseAddr(b.ProbeAddress)
	}
	port := b.Port
	if hc.Port != 0 {
		port = hc.Port
	}
	if b.ProbePort != 0 {
		port = b.ProbePort
	}
	return probeKey{
		target: netip.AddrPortFrom(addr, port), protocol: hc.Protocol, path: hc.Path,
		interval: hc.Interval.Duration, timeout: hc.Timeout.Duration,
		unhealthy: hc.UnhealthyThreshold, healthy: hc.HealthyThreshold,
	}
}

// prober probes one target on an interval and keeps its health, changing
// it only after the configured number of consecutive results.
type prober struct {
	key     probeKey
	healthy atomic.Bool
	// confirmed: a probe has succeeded (healthy alone starts true, as
	// HAProxy starts servers up, so it says nothing until a probe ran).
	confirmed atomic.Bool
	// results counts the probes whose result has been recorded, so that a
	// test can wait for one instead of sleeping.
	results atomic.Uint64
	cancel  context.CancelFunc
	done    chan struct{}
}

// dialFunc dials a network address.
type dialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// startProber starts probing; the target counts as healthy until it fails
// the unhealthy threshold (as HAProxy starts servers up), and the first
// probe runs at once.
func startProber(k probeKey, dial dialFunc, clk clock.WithTicker, m *metrics, log logr.Logger, onChange func()) *prober {
	ctx, cancel := context.WithCancel(context.Background())
	p := &prober{key: k, cancel: cancel, done: make(chan struct{})}
	p.healthy.Store(true)
	m.probeUp.WithLabelValues(k.String(), string(k.protocol)).Set(1)
	client := &http.Client{
		Timeout: k.timeout,
		Transport: &http.Transport{
			DialContext:       dial,
			DisableKeepAlives: true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	go func() {
		defer close(p.done)
		ticker := clk.NewTicker(k.interval)
		defer ticker.Stop()
		oks, fails := 0, 0
		for {
			err := p.probeOnce(ctx, client, dial)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				oks, fails = oks+1, 0
				p.confirmed.Store(true)
			} else {
				oks, fails = 0, fails+1
			}
			if p.observe(oks, fails, err, m, log) {
				onChange()
			}
			p.results.Add(1)
			select {
			case <-ctx.Done():
				return
			case <-ticker.C():
			}
		}
	}()
	return p
}

// observe moves the health across a threshold and reports the
// transition; it returns whether the health changed.
func (p *prober) observe(oks, fails int, err error, m *metrics, log logr.Logger) bool {
	was := p.healthy.Load()
	switch {
	case was && fails >= p.key.unhealthy:
		p.healthy.Store(false)
		m.probeUp.WithLabelValues(p.key.String(), string(p.key.protocol)).Set(0)
		m.probeTransitions.WithLabelValues(p.key.String(), string(p.key.protocol), "down").Inc()
		log.Info("Probe target is down", "target", p.key.String(), "consecutiveFailures", fails, "err", err.Error())
		return true
	case !was && oks >= p.key.healthy:
		p.healthy.Store(true)
		m.probeUp.WithLabelValues(p.key.String(), string(p.key.protocol)).Set(1)
		m.probeTransitions.WithLabelValues(p.key.String(), string(p.key.protocol), "up").Inc()
		log.Info("Probe target is up", "target", p.key.String(), "consecutiveSuccesses", oks)
		return true
	}
	return false
}

// probeOnce runs one probe: a TCP connect, or an HTTP GET that must answer
// 200.
func (p *prober) probeOnce(ctx context.Context, client *http.Client, dial dialFunc) error {
	ctx, cancel := context.WithTimeout(ctx, p.key.timeout)
	defer cancel()
	if p.key.protocol == ProbeTCP {
		c, err := dial(ctx, "tcp", p.key.target.String())
		if err != nil {
			return err
		}
		return c.Close()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.key.target.String()+p.key.path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "ebb-dataplane-probe")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// stop ends the probe loop and forgets its series.
func (p *prober) stop(m *metrics) {
	p.cancel()
	<-p.done
	m.probeUp.DeleteLabelValues(p.key.String(), string(p.key.protocol))
	for _, to := range []string{"up", "down"} {
		m.probeTransitions.DeleteLabelValues(p.key.String(), string(p.key.protocol), to)
	}
}
