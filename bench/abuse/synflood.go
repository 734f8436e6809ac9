package main

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ebbdev/ebb/internal/synflood"
)

// The SYN flood's sources: addresses of the client's host that drop the
// backend's answers (synFloodSources), so that the flood's connections
// stay half-open and the client's host never resets them, as a flood from
// spoofed addresses does.
var synFloodSources = []netip.Prefix{netip.MustParsePrefix("10.78.1.3/24"), netip.MustParsePrefix("10.78.1.4/24")}

// synFloodResult is what the SYN flood cost the eBPF path's legitimate
// clients.
type synFloodResult struct {
	legitRate float64
	sent      int64
}

// addSYNFloodSources gives the client's host the flood's source
// addresses, and has it drop the answers to them.
func addSYNFloodSources(h *hosts) error {
	for _, p := range synFloodSources {
		if err := h.client.AddAddress("eth0", p); err != nil {
			return fmt.Errorf("adding the SYN flood's source %s: %w", p, err)
		}
	}
	to := make([]netip.Addr, len(synFloodSources))
	for i, p := range synFloodSources {
		to[i] = p.Addr()
	}
	return h.client.Do(func() error { return synflood.DropAnswers("bench-abuse-flood", to) })
}

// synFlood sends rate SYNs a second to target for d, each from the next
// port of the flood's sources, while legitimate clients keep connecting to
// the eBPF path's frontend (measured over the flood's second half).
func synFlood(ctx context.Context, h *hosts, target netip.AddrPort, rate int, d time.Duration) (synFloodResult, error) {
	var s *synflood.Sender
	if err := h.client.Do(func() (err error) { s, err = synflood.Open(); return err }); err != nil {
		return synFloodResult{}, err
	}
	defer s.Close()
	var sent atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sendSYNs(s, target, rate, stop, &sent)
	}()
	time.Sleep(d / 2)
	res := synFloodResult{legitRate: legitRate(ctx, h.client, ebpfFrontend, d/2)}
	close(stop)
	wg.Wait()
	res.sent = sent.Load()
	return res, nil
}

// sendSYNs sends rate SYNs a second to to until stop, in batches every
// 10 ms, each from the next port (1024 and up) of the flood's sources by
// turns.
func sendSYNs(s *synflood.Sender, to netip.AddrPort, rate int, stop <-chan struct{}, sent *atomic.Int64) {
	port, seq := uint16(1024), uint32(1)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	per := max(rate/100, 1)
	for i := 0; ; {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for range per {
			from := netip.AddrPortFrom(synFloodSources[i%len(synFloodSources)].Addr(), port)
			if i++; i%len(synFloodSources) == 0 {
				if port++; port == 0 {
					port = 1024
				}
			}
			seq += 2654435761
			if s.Send(from, to, seq) == nil {
				sent.Add(1)
			}
		}
	}
}
