// Package loadgen drives traffic through a load balancer the way clients
// do, and counts what they would notice: requests on new connections at a
// constant rate (each answer names the pod and node that served it), and
// long-lived connections that must not break. The demo, the drain
// benchmark and the end-to-end tests share it.
package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Requests sends GETs on new connections at a constant rate.
type Requests struct {
	URL     string
	Rate    int
	Timeout time.Duration
	// Dial, if set, opens the connections (a client in another network
	// namespace); default: this process's.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Serving, if set, names what served a request from its answer's
	// body (Sample.Node); default: the "node" of the local cluster's echo
	// servers' JSON. agnhost's /hostname answers the pod's name.
	Serving func(body []byte) string

	client  *http.Client
	start   time.Time
	done    chan struct{}
	wg      sync.WaitGroup
	sent    atomic.Int64
	failed  atomic.Int64
	mu      sync.Mutex
	samples []Sample
	lastErr string
}

// Sample is one request.
type Sample struct {
	// At is when it was sent, from the start.
	At      time.Duration
	Latency time.Duration
	// Node served it ("" if it failed).
	Node   string
	Failed bool
}

// Start begins sending.
func (r *Requests) Start() {
	if r.Timeout == 0 {
		r.Timeout = 3 * time.Second
	}
	r.client = &http.Client{Timeout: r.Timeout, Transport: &http.Transport{DisableKeepAlives: true, MaxIdleConnsPerHost: -1, DialContext: r.Dial}}
	r.done = make(chan struct{})
	r.start = time.Now()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		tick := time.NewTicker(time.Second / time.Duration(max(r.Rate, 1)))
		defer tick.Stop()
		for {
			select {
			case <-r.done:
				return
			case <-tick.C:
			}
			r.sent.Add(1)
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				r.one()
			}()
		}
	}()
}

// identity is the part of the echo server's answer loadgen reads.
type identity struct {
	Node string `json:"node"`
}

func (r *Requests) one() {
	at := time.Since(r.start)
	t0 := time.Now()
	s := Sample{At: at}
	resp, err := r.client.Get(r.URL)
	if err == nil {
		body, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		var id identity
		switch {
		case rerr != nil:
			err = rerr
		case resp.StatusCode != http.StatusOK:
			err = fmt.Errorf("status %d", resp.StatusCode)
		case r.Serving != nil:
			s.Node = r.Serving(body)
		default:
			_ = json.NewDecoder(bytes.NewReader(body)).Decode(&id)
			s.Node = id.Node
		}
	}
	s.Latency = time.Since(t0)
	s.Failed = err != nil
	r.mu.Lock()
	r.samples = append(r.samples, s)
	if err != nil {
		r.failed.Add(1)
		r.lastErr = err.Error()
	}
	r.mu.Unlock()
}

// Stop stops sending and waits for the requests in flight.
func (r *Requests) Stop() {
	close(r.done)
	r.wg.Wait()
}

// Counts returns how many requests were sent and failed so far.
func (r *Requests) Counts() (sent, failed int64) { return r.sent.Load(), r.failed.Load() }

// LastError is the last failure's text.
func (r *Requests) LastError() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}

// Started is when Start was called.
func (r *Requests) Started() time.Time { return r.start }

// Probe sends one request now (not counted) and returns its error.
func (r *Requests) Probe() error {
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: r.Dial}}
	resp, err := c.Get(r.URL)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// Samples returns the requests finished so far, by send time.
func (r *Requests) Samples() []Sample {
	r.mu.Lock()
	out := append([]Sample(nil), r.samples...)
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out
}

// LongLived is one long-lived TCP connection that echoes a message every
// interval and records whether it ever broke.
type LongLived struct {
	conn   net.Conn
	done   chan struct{}
	wg     sync.WaitGroup
	broken atomic.Pointer[string]
	echoes atomic.Int64
}

// OpenLongLived dials addr and starts echoing every interval.
func OpenLongLived(addr string, interval time.Duration) (*LongLived, error) {
	return OpenLongLivedVia(nil, addr, interval)
}

// OpenLongLivedVia is OpenLongLived with a dialer of the caller's (nil:
// this process's).
func OpenLongLivedVia(dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string, interval time.Duration) (*LongLived, error) {
	return openLongLived(dial, addr, interval, echoBytes)
}

// OpenLongLivedHTTPVia is OpenLongLivedVia speaking HTTP/1.1 keep-alive:
// every interval a GET /echo?msg=... on the same connection, whose answer
// must be the message (agnhost netexec's /echo), as a client with a
// connection pool does.
func OpenLongLivedHTTPVia(dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string, interval time.Duration) (*LongLived, error) {
	return openLongLived(dial, addr, interval, echoHTTP(addr))
}

// roundTrip sends message i on conn and checks its echo.
type roundTrip func(conn net.Conn, r *bufio.Reader, i int) error

// echoBytes writes a line and reads it back (the echo servers' raw TCP
// echo).
func echoBytes(conn net.Conn, r *bufio.Reader, i int) error {
	msg := fmt.Sprintf("long-lived %d\n", i)
	if _, err := conn.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(r, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return fmt.Errorf("echo %q, want %q", buf, msg)
	}
	return nil
}

// echoHTTP asks for /echo?msg=long-lived-i on a kept-alive connection.
func echoHTTP(host string) roundTrip {
	return func(conn net.Conn, r *bufio.Reader, i int) error { return EchoHTTP(conn, r, host, i) }
}

// EchoHTTP sends GET /echo?msg=long-lived-i to agnhost netexec on the
// kept-alive connection conn (its replies read through r) and checks the
// echo; an answer that closes the connection is an error too.
func EchoHTTP(conn net.Conn, r *bufio.Reader, host string, i int) error {
	msg := fmt.Sprintf("long-lived-%d", i)
	if _, err := fmt.Fprintf(conn, "GET /echo?msg=%s HTTP/1.1\r\nHost: %s\r\n\r\n", msg, host); err != nil {
		return err
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || string(body) != msg {
		return fmt.Errorf("answer %s %q, want 200 %q", resp.Status, body, msg)
	}
	if resp.Close {
		return fmt.Errorf("the server closed the kept-alive connection after message %d", i)
	}
	return nil
}

func openLongLived(dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string, interval time.Duration, trip roundTrip) (*LongLived, error) {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	l := &LongLived{conn: conn, done: make(chan struct{})}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		r := bufio.NewReader(conn)
		for i := 0; ; i++ {
			select {
			case <-l.done:
				return
			case <-time.After(interval):
			}
			_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
			if err := trip(conn, r, i); err != nil {
				l.fail(err)
				return
			}
			l.echoes.Add(1)
		}
	}()
	return l, nil
}

func (l *LongLived) fail(err error) {
	select {
	case <-l.done:
		return // closing
	default:
	}
	msg := err.Error()
	l.broken.Store(&msg)
}

// Broken returns why the connection broke ("" if it did not).
func (l *LongLived) Broken() string {
	if p := l.broken.Load(); p != nil {
		return *p
	}
	return ""
}

// Echoes counts the successful round trips.
func (l *LongLived) Echoes() int64 { return l.echoes.Load() }

// Close ends the connection cleanly.
func (l *LongLived) Close() {
	close(l.done)
	_ = l.conn.Close()
	l.wg.Wait()
}
