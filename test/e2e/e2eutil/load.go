package e2eutil

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ebbdev/ebb/internal/localcluster"
)

// Load counts the successes and failures of something repeated until
// halted.
type Load struct {
	OK, Failed atomic.Int64
	// Slow counts the successes that took SlowRequest or longer (StartRequests).
	Slow atomic.Int64
	// FirstErr holds the first failure's error.
	FirstErr atomic.Value
	errsMu   sync.Mutex
	errs     []error
	errTimes []time.Time
	stop     chan struct{}
	once     sync.Once
	wg       sync.WaitGroup
}

// NewLoad returns a load that is halted when the test ends, if not before
// (a failed test must not leave it running into the next).
func NewLoad(t *testing.T) *Load {
	l := &Load{stop: make(chan struct{})}
	t.Cleanup(l.Halt)
	return l
}

// Fail counts one failure. Its error keeps the time it came (UTC), to be
// read beside the cluster's logs.
func (l *Load) Fail(err error) {
	now := time.Now()
	err = fmt.Errorf("at %s: %w", now.UTC().Format("15:04:05.000"), err)
	l.Failed.Add(1)
	l.FirstErr.CompareAndSwap(nil, err)
	l.errsMu.Lock()
	defer l.errsMu.Unlock()
	if len(l.errs) < maxErrors {
		l.errs = append(l.errs, err)
		l.errTimes = append(l.errTimes, now)
	}
}

// FailTimes returns when the first failures came (up to 20).
func (l *Load) FailTimes() []time.Time {
	l.errsMu.Lock()
	defer l.errsMu.Unlock()
	return slices.Clone(l.errTimes)
}

// maxErrors is how many failures' errors a load keeps.
const maxErrors = 20

// Errors returns the first failures' errors (up to 20).
func (l *Load) Errors() []error {
	l.errsMu.Lock()
	defer l.errsMu.Unlock()
	return slices.Clone(l.errs)
}

// Stopped says whether the load was halted.
func (l *Load) Stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// Go runs f in a goroutine that Halt waits for.
func (l *Load) Go(f func()) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f()
	}()
}

// Halt stops the load and waits for its goroutines.
func (l *Load) Halt() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// SlowRequest is as long as a request on the local cluster's network
// takes when a packet of it was lost and resent (TCP's first
// retransmission of a SYN waits 1 s); they take about a millisecond.
const SlowRequest = time.Second

// StartRequests sends requests, each on a new connection, one after
// another on each of workers.
func StartRequests(t *testing.T, ctx context.Context, client *http.Client, url string, workers int) *Load {
	l := NewLoad(t)
	for range workers {
		l.Go(func() {
			for !l.Stopped() {
				start := time.Now()
				if err := GetOK(ctx, client, url); err != nil {
					l.Fail(err)
					continue
				}
				l.OK.Add(1)
				if time.Since(start) >= SlowRequest {
					l.Slow.Add(1)
				}
			}
		})
	}
	return l
}

// StartLongLived opens n connections from the cluster's external client
// and sends a request on each every 100 ms until halted; a connection that
// breaks counts one failure and ends.
func StartLongLived(t *testing.T, ctx context.Context, c *localcluster.Cluster, at netip.AddrPort, n int) *Load {
	l := NewLoad(t)
	for i := range n {
		l.Go(func() {
			conn, err := c.ExternalClient.DialContext(ctx, "tcp", at.String())
			if err != nil {
				l.Fail(fmt.Errorf("long-lived connection %d: %w", i, err))
				return
			}
			defer conn.Close()
			r := bufio.NewReader(conn)
			for !l.Stopped() {
				if err := keepAliveRequest(conn, r, at); err != nil {
					l.Fail(fmt.Errorf("long-lived connection %d after %d requests: %w", i, l.OK.Load(), err))
					return
				}
				l.OK.Add(1)
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	return l
}

// keepAliveRequest sends one HTTP/1.1 request on c and reads its answer,
// leaving the connection open.
func keepAliveRequest(c net.Conn, r *bufio.Reader, at netip.AddrPort) error {
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", at); err != nil {
		return err
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// GrepLines returns the lines of page that contain substr.
func GrepLines(page, substr string) string {
	var out []string
	for _, line := range strings.Split(page, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
