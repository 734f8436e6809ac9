package podserver

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/pires/go-proxyproto"
)

// Identity is what a pod's HTTP echo answers with, so a client can tell
// which pod on which node served it.
type Identity struct {
	Pod       string `json:"pod"`
	Namespace string `json:"namespace"`
	Node      string `json:"node"`
	PodIP     string `json:"podIP"`
	Port      int    `json:"port"`
	// Client is the address the request came from, as the pod saw it.
	Client string `json:"client,omitempty"`
	Path   string `json:"path,omitempty"`
}

// maxDelay bounds the ?delay= a request may ask for.
const maxDelay = 5 * time.Minute

// httpHandler serves the HTTP echo of one pod port: GET /healthz answers
// "ok"; any other path answers the pod's Identity as JSON, after
// ?delay=<duration> if given (to hold a request in flight).
func httpHandler(id Identity) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			_, _ = io.WriteString(w, "ok\n")
			return
		}
		if d := r.URL.Query().Get("delay"); d != "" {
			delay, err := time.ParseDuration(d)
			if err != nil || delay < 0 || delay > maxDelay {
				http.Error(w, "delay must be a duration between 0 and 5m, like 250ms", http.StatusBadRequest)
				return
			}
			select {
			case <-time.After(delay):
			case <-r.Context().Done():
				return
			}
		}
		answer := id
		answer.Client = r.RemoteAddr
		answer.Path = r.URL.Path
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Pod-Name", id.Pod)
		_ = json.NewEncoder(w).Encode(answer)
	})
}

// httpMethods are the request-line prefixes that make a TCP connection HTTP.
var httpMethods = [][]byte{
	[]byte("GET "), []byte("HEAD "), []byte("POST "), []byte("PUT "), []byte("DELETE "),
	[]byte("OPTIONS "), []byte("PATCH "), []byte("CONNECT "), []byte("TRACE "),
}

// isHTTP peeks at the first bytes of a connection and reports whether they
// start an HTTP request. It reads no more than it must: a raw echo client
// that writes a few bytes and waits for them back is not kept waiting unless
// its bytes could still be the start of a method.
func isHTTP(br *bufio.Reader) (bool, error) {
	for n := 1; ; {
		if _, err := br.Peek(n); err != nil {
			if errors.Is(err, io.EOF) && br.Buffered() > 0 {
				return false, nil // a short message, then a half-close: echo it
			}
			return false, err
		}
		head, _ := br.Peek(min(br.Buffered(), 8))
		couldBe := false
		for _, m := range httpMethods {
			if bytes.HasPrefix(head, m) {
				return true, nil
			}
			if len(head) < len(m) && bytes.HasPrefix(m, head) {
				couldBe = true
			}
		}
		if !couldBe {
			return false, nil
		}
		n = len(head) + 1
	}
}

// echo copies everything the client sends back to it, and half-closes the
// write side once the client has finished sending.
func echo(conn net.Conn, br *bufio.Reader) {
	_, _ = io.Copy(conn, br)
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.CloseWrite()
	}
}

// peekedConn is a connection whose first bytes were read into a buffer,
// from the client at remote (the PROXY header's, when one came first).
type peekedConn struct {
	net.Conn
	r      *bufio.Reader
	remote net.Addr
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *peekedConn) RemoteAddr() net.Addr { return c.remote }

// readProxyHeader reads a PROXY protocol v2 header if the connection starts
// with one (as ebb's proxy engine sends it for a Service annotated
// lb.ebb.dev/proxy-protocol: v2) and returns the client it names, or peer.
// The echo reads one without being asked, as a test server may: a real
// backend must trust the header only from its load balancers. Only a first
// byte '\r' is looked at further, so that a raw echo client's short message
// is never held waiting for more bytes.
func readProxyHeader(br *bufio.Reader, peer net.Addr) (net.Addr, error) {
	first, err := br.Peek(1)
	if err != nil || first[0] != proxyproto.SIGV2[0] {
		return peer, nil // an empty connection is isHTTP's to see
	}
	h, err := proxyproto.Read(br)
	switch {
	case errors.Is(err, proxyproto.ErrNoProxyProtocol):
		return peer, nil
	case err != nil:
		return nil, fmt.Errorf("reading a PROXY protocol header: %w", err)
	}
	if src, _, ok := h.TCPAddrs(); ok {
		return src, nil
	}
	return peer, nil // a LOCAL command (a health check) names no client
}

// connListener hands connections already accepted elsewhere to an
// http.Server.
type connListener struct {
	addr  net.Addr
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

func newConnListener(addr net.Addr) *connListener {
	return &connListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// offer passes c to the server; false if the listener is closed.
func (l *connListener) offer(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }

// serveUDP echoes every datagram back to its sender until pc is closed.
func serveUDP(pc net.PacketConn) {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		_, _ = pc.WriteTo(buf[:n], from)
	}
}

func portString(p int32) string { return strconv.Itoa(int(p)) }
