package main

import (
	"fmt"
	"io"
	"net"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ebbdev/ebb/internal/stats"
)

// echoBackend is a TCP echo server that records when it accepts.
type echoBackend struct {
	ln       net.Listener
	accepted atomic.Int64
	mu       sync.Mutex
	accepts  []time.Time
	record   atomic.Bool
}

func newEchoBackend(t *topology) (*echoBackend, error) {
	ln, err := t.listenBackend()
	if err != nil {
		return nil, err
	}
	b := &echoBackend{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.accepted.Add(1)
			if b.record.Load() {
				now := time.Now()
				b.mu.Lock()
				b.accepts = append(b.accepts, now)
				b.mu.Unlock()
			}
			go func() {
				_, _ = io.Copy(c, c)
				_ = c.Close()
			}()
		}
	}()
	return b, nil
}

// acceptsAfter counts recorded accepts later than t.
func (b *echoBackend) acceptsAfter(t time.Time) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, a := range b.accepts {
		if a.After(t) {
			n++
		}
	}
	return n
}

// exchange writes msg and reads as many bytes back.
func exchange(c net.Conn, msg, buf []byte) error {
	if _, err := c.Write(msg); err != nil {
		return err
	}
	_, err := io.ReadFull(c, buf[:len(msg)])
	return err
}

// runWorkers runs fn on n goroutines, each on the client's host, until d
// has passed and returns the sum of what they counted and the errors.
func (t *topology) runWorkers(n int, d time.Duration, fn func(stop *atomic.Bool) (int64, int64)) (ops, errs int64) {
	var stop atomic.Bool
	var total, failed atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.asClient(func() {
				o, e := fn(&stop)
				total.Add(o)
				failed.Add(e)
			})
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	return total.Load(), failed.Load()
}

// opTimeout bounds a new connection's dial and exchange.
const opTimeout = 5 * time.Second

// newConnections: each operation is a new connection carrying one 64-byte
// request and its echo.
func (t *topology) newConnections(addr string, workers int, d time.Duration) (int64, int64) {
	return t.runWorkers(workers, d, func(stop *atomic.Bool) (int64, int64) {
		msg, buf := make([]byte, 64), make([]byte, 64)
		var ok, bad int64
		dialer := t.dialer()
		for !stop.Load() {
			c, err := dialer.Dial("tcp", addr)
			if err != nil {
				bad++
				continue
			}
			// A lost packet fails the operation rather than hang the run.
			_ = c.SetDeadline(time.Now().Add(opTimeout))
			if exchange(c, msg, buf) != nil {
				bad++
			} else {
				ok++
			}
			_ = c.Close()
		}
		return ok, bad
	})
}

// keepAlive: each operation is a 64-byte request and echo on a connection
// that stays open.
func (t *topology) keepAlive(addr string, workers int, d time.Duration) (int64, int64) {
	return t.runWorkers(workers, d, func(stop *atomic.Bool) (int64, int64) {
		c, err := t.dialer().Dial("tcp", addr)
		if err != nil {
			return 0, 1
		}
		defer c.Close()
		msg, buf := make([]byte, 64), make([]byte, 64)
		var ok int64
		for !stop.Load() {
			if exchange(c, msg, buf) != nil {
				return ok, 1
			}
			ok++
		}
		return ok, 0
	})
}

// bulk: each operation is 64 KiB sent and echoed; returns bytes echoed.
func (t *topology) bulk(addr string, workers int, d time.Duration) (int64, int64) {
	const size = 64 << 10
	return t.runWorkers(workers, d, func(stop *atomic.Bool) (int64, int64) {
		c, err := t.dialer().Dial("tcp", addr)
		if err != nil {
			return 0, 1
		}
		defer c.Close()
		msg, buf := make([]byte, size), make([]byte, size)
		var n int64
		for !stop.Load() {
			if exchange(c, msg, buf) != nil {
				return n, 1
			}
			n += size
		}
		return n, 0
	})
}

// Added latency comes from slices of round trips through the contender
// and straight to the backend, alternated.
const (
	latencyPairs = 10
	latencySlice = 2000 // round trips
)

// addedLatency is what the load balancer at via adds to a 64-byte round
// trip, at the median and the 99th percentile, in µs: slices through it
// and straight to the backend at direct alternate (alternateSlices), and each
// path's round trips are pooled. Measured once each, seconds apart, the
// two tails met different moments of a machine whose neighbours come and
// go: the same contender's p99 moved by 3x between rounds. prepare is as
// for alternateSlices.
func (t *topology) addedLatency(via, direct string, prepare func(load bool) error) (p50, p99 float64, err error) {
	var through, straight []time.Duration
	err = alternateSlices(latencyPairs, prepare, func(_ int, isLoad bool) error {
		addr, pool := direct, &straight
		if isLoad {
			addr, pool = via, &through
		}
		lat, err := t.latencies(addr, latencySlice)
		if err != nil {
			return fmt.Errorf("round trips to %s: %w", addr, err)
		}
		*pool = append(*pool, lat...)
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	slices.Sort(through)
	slices.Sort(straight)
	added := func(q float64) float64 {
		return us(stats.Percentile(through, q) - stats.Percentile(straight, q))
	}
	return added(0.50), added(0.99), nil
}

// latencies measures round trips of 64 bytes on one connection.
func (t *topology) latencies(addr string, n int) ([]time.Duration, error) {
	c, err := t.dial(addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	msg, buf := make([]byte, 64), make([]byte, 64)
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := exchange(c, msg, buf); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}
